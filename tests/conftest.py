"""Shared fixtures. Tests under e2e/, docs/ and cli/ are marked ``slow``.

Without the ``tasks`` extra (CI's newest-FastMCP lane installs ``.[mcp,yaml,test]``),
the test files that import it are not collected and tests marked ``tasks`` are
deselected; the report header says so. With the extra installed, everything runs.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

# The flow_kit fixture, loaded as docs/testing.md tells flow authors to.
pytest_plugins = ["chainweaver.testing_plugin"]
TESTS_ROOT = Path(__file__).resolve().parent
SLOW_DIRECTORIES = {"e2e", "docs", "cli"}
TASKS_INSTALLED = importlib.util.find_spec("fastmcp_tasks") is not None
# Test files that import the tasks extra (fastmcp-tasks, Docket, the Redis client).
TASK_TEST_FILES = [
    "e2e/test_redis_fixture.py", "e2e/test_task_approval_redis.py",
    "e2e/test_task_security_http.py", "e2e/test_tasks_redis.py",
    "mcp/tasks/test_task_approval.py", "mcp/tasks/test_task_approval_attacks.py",
    "mcp/tasks/test_task_security.py", "mcp/tasks/test_tasks.py",
    "mcp/gate/test_rate_limit_redis.py", "e2e/test_durable_visibility.py",
    "e2e/test_shared_governance_tasks.py", "e2e/test_large_outputs_tasks.py",
    "mcp/runs/test_run_cancel_records.py",
    "mcp/runs/test_run_store_failures.py", "mcp/runs/test_run_store_hostile.py",
    "cli/test_cli_hostile_state.py", "e2e/test_task_store_closes.py",
    "mcp/test_step_grants_tasks.py", "e2e/test_step_grants_redis.py",
    "mcp/tasks/test_task_status_writes.py", "e2e/test_task_round_trips.py",
    "mcp/tasks/test_worker_busy_poll.py", "e2e/test_shared_governance_task_asks.py",
    "mcp/tasks/test_worker_refusals.py",
]
collect_ignore = [] if TASKS_INSTALLED else TASK_TEST_FILES


def pytest_report_header() -> str:
    if TASKS_INSTALLED:
        return "chainweaver: tasks extra installed, task tests included"
    return (f"chainweaver: tasks extra not installed: {len(TASK_TEST_FILES)} task test files "
            "not collected, tests marked 'tasks' deselected")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast lane (``-m "not slow"``) does not even import the slow directories:
    every test in them is slow, and importing them costs each worker seconds."""
    if config.option.markexpr.strip() != "not slow":
        return None
    try:
        relative = collection_path.resolve().relative_to(TESTS_ROOT)
    except ValueError:
        return None
    return True if relative.parts and relative.parts[0] in SLOW_DIRECTORIES else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        relative = Path(str(item.path)).resolve().relative_to(TESTS_ROOT)
        if relative.parts[0] in SLOW_DIRECTORIES:
            item.add_marker(pytest.mark.slow)
    if not TASKS_INSTALLED:
        needing = [item for item in items if item.get_closest_marker("tasks")]
        if needing:
            config.hook.pytest_deselected(items=needing)
            items[:] = [item for item in items if not item.get_closest_marker("tasks")]


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
