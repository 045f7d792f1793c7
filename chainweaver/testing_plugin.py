"""The pytest plugin of :mod:`chainweaver.testing`: the ``flow_kit`` fixture.

Installed with chainweaver (the ``pytest11`` entry point), so pytest loads it in every
run of an environment that has chainweaver. It imports chainweaver only when a test
asks for the fixture: loading it needs neither the MCP extra nor any other, and a
coverage measurement of chainweaver is not started too late.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from chainweaver.testing import FlowKit


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Leave chainweaver's modules to the normal import system.

    pytest marks every package of a plugin's distribution for assertion rewriting, and
    its import hook then loads them all. chainweaver has no test assertions to rewrite,
    and a package loaded by that hook cannot be run with ``runpy`` (``python -m
    chainweaver`` inside a test): the hook has no ``get_code``. This runs before any
    conftest imports chainweaver; if pytest's internals change, nothing happens.
    """
    hook = getattr(early_config.pluginmanager, "rewrite_hook", None)
    marked = getattr(hook, "_must_rewrite", None)
    if isinstance(marked, set):
        marked.discard("chainweaver")


@pytest.fixture
def flow_kit() -> FlowKit:
    """A fresh :class:`~chainweaver.testing.FlowKit`: add tools, fakes and sub-flows,
    then ``flow_kit.run(flow, input)``."""
    from chainweaver.testing import FlowKit

    return FlowKit()
