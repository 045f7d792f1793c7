"""Shared fixtures. Tests under e2e/, docs/ and cli/ are marked ``slow``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

SLOW_DIRECTORIES = {"e2e", "docs", "cli"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_root = Path(__file__).resolve().parent
    for item in items:
        relative = Path(str(item.path)).resolve().relative_to(tests_root)
        if relative.parts[0] in SLOW_DIRECTORIES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` at DEBUG, extended to fastmcp's logger, which does not propagate."""
    fastmcp_logger = logging.getLogger("fastmcp")
    level = fastmcp_logger.level
    fastmcp_logger.addHandler(caplog.handler)
    fastmcp_logger.setLevel(logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    try:
        yield caplog
    finally:
        fastmcp_logger.removeHandler(caplog.handler)
        fastmcp_logger.setLevel(level)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A private Redis server for the whole test session (tests using it are ``slow``).

    Tests sharing it use their own key prefixes or database numbers, or flush it.
    """
    from support.redis_server import redis_server

    with redis_server() as url:
        yield url
