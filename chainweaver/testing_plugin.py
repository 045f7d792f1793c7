"""The pytest plugin of :mod:`chainweaver.testing`: the ``flow_kit`` fixture.

Load it in a test suite's ``conftest.py`` with
``pytest_plugins = ["chainweaver.testing_plugin"]`` (or run ``pytest -p
chainweaver.testing_plugin``). It is not registered for every pytest run of every
environment chainweaver is installed in: a plugin pytest loads that way is imported
before anything else, so a coverage measurement started by pytest-cov would miss the
import of chainweaver itself, and its modules would go through pytest's assertion
rewriter. It imports chainweaver only when a test asks for the fixture, and needs no
extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from chainweaver.testing import FlowKit


@pytest.fixture
def flow_kit() -> FlowKit:
    """A fresh :class:`~chainweaver.testing.FlowKit`: add tools, fakes and sub-flows,
    then ``flow_kit.run(flow, input)``."""
    from chainweaver.testing import FlowKit

    return FlowKit()
