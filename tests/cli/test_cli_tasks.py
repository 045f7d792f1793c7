"""The CLI's background-task flags and the ``worker`` command (in process; the
multi-process runs are in tests/e2e/test_tasks_redis.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chainweaver.cli import main
from chainweaver.mcp import FlowServer
from chainweaver.mcp.components.provider import FlowProvider

ROOT = Path(__file__).resolve().parents[2]
FLOWS = str(ROOT / "tests" / "servers" / "task_flows")
TOOLS = str(ROOT / "tests" / "servers" / "task_tools.py")
BASE = [FLOWS, "--tools", TOOLS, "--side-effects", "read,write"]


@pytest.fixture(autouse=True)
def restore_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    # These tests are about the flags: the queue they name (nothing listens on port 1)
    # counts as reachable here. Reaching it for real: test_cli_stores.py.
    monkeypatch.setattr("chainweaver.cli.stores.redis_ping", lambda url, timeout: None)
    yield


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def working(calls: list[FlowServer], server: FlowServer) -> None:
    calls.append(server)  # what the worker command runs, not running it


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[FlowServer]:
    calls: list[FlowServer] = []
    monkeypatch.setattr(FlowServer, "serve", lambda self, *a, **k: calls.append(self))
    monkeypatch.setattr(FlowServer, "run_worker_async", lambda self: working(calls, self))
    return calls


def task_names(server: FlowServer) -> list[str]:
    (provider,) = [p for p in server.fastmcp.providers if isinstance(p, FlowProvider)]
    return provider.task_tool_names()


def test_serve_with_tasks(capsys: pytest.CaptureFixture, served: list) -> None:
    code, out, err = run(capsys, "serve", *BASE, "--tasks", "memory://", "--task-mode",
                         "forbidden", "--task-concurrency", "0", "--task-redelivery", "2.5")
    assert (code, out) == (0, ""), err
    (server,) = served
    assert task_names(server) == ["charge_order", "lookup_order"]
    (extension,) = server.fastmcp._extensions.values()
    settings: Any = extension.docket_settings  # type: ignore[attr-defined]
    assert (settings.url, settings.concurrency,
            settings.redelivery_timeout.total_seconds()) == ("memory://", 0, 2.5)


def test_without_tasks_required_flows_are_excluded(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "inspect", *BASE)
    assert code == 0
    assert "charge_order  1.0.0    it runs only as a background task" in out


def test_worker_runs_with_a_redis_queue(capsys: pytest.CaptureFixture, served: list) -> None:
    code, out, err = run(capsys, "worker", *BASE, "--tasks", "redis://127.0.0.1:1/0")
    assert (code, out) == (0, ""), err
    (server,) = served
    assert task_names(server) == ["charge_order", "lookup_order", "report"]


@pytest.mark.parametrize(("argv", "message"), [
    (["worker", *BASE], "worker needs --tasks redis://"),
    (["worker", *BASE, "--tasks", "memory://"], "worker needs --tasks redis://"),
    (["worker", *BASE, "--tasks", "redis://127.0.0.1:1/0", "--watch"],
     "worker does not take --watch"),
    (["serve", *BASE, "--task-concurrency", "0"], "--task-concurrency and --task-redelivery "
                                                   "need --tasks"),
    (["serve", *BASE, "--tasks", "ftp://x"], "tasks must be None or a URL"),
])
def test_task_flag_mistakes_are_clear_errors(capsys: pytest.CaptureFixture, served: list,
                                             argv: list[str], message: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code != 0 and message in err
    assert served == []
    if argv[0] == "worker":  # refused before loading anything or printing a summary
        assert "loaded" not in err


@pytest.mark.parametrize("value", ["-1", "two"])
def test_task_concurrency_must_be_a_count(capsys: pytest.CaptureFixture, value: str) -> None:
    with pytest.raises(SystemExit):
        main(["serve", *BASE, "--tasks", "memory://", "--task-concurrency", value])
    assert "--task-concurrency" in capsys.readouterr().err


def test_ctrl_c_stops_a_worker(capsys: pytest.CaptureFixture,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    async def interrupted(self: FlowServer) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(FlowServer, "run_worker_async", interrupted)
    code, _, err = run(capsys, "worker", *BASE, "--tasks", "redis://127.0.0.1:1/0")
    assert code == 0 and "Traceback" not in err


def test_the_worker_summary_names_the_queue_without_its_password(
        capsys: pytest.CaptureFixture, served: list) -> None:
    code, _, err = run(capsys, "worker", *BASE, "--tasks",
                       "redis://cw:s3cret@127.0.0.1:1/0")
    assert code == 0
    assert err.splitlines()[-1] == ("chainweaver: running task flows from "
                                    "redis://cw:***@127.0.0.1:1/0")
    assert "s3cret" not in err
