"""`serve` and `worker` reach every Redis store their flags name before they start: a
store that does not answer is named (password masked) with the reason, waited for up to
`--store-wait` seconds (said on stderr), then the process exits with 3; a store that
comes up during the wait is used. While serving, the task queue's outage lines name it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import run
from support.procs import STARTUP_TIMEOUT, free_port
from support.shared_governance import RestartableRedis

from chainweaver.mcp import FlowServer

pytestmark = pytest.mark.tasks  # the Redis client, and the task queue

ROOT = Path(__file__).resolve().parents[2]
FLOWS = str(ROOT / "tests" / "servers" / "task_flows")
TOOLS = str(ROOT / "tests" / "servers" / "task_tools.py")
BASE = [FLOWS, "--tools", TOOLS, "--side-effects", "read,write"]
CHAINWEAVER = str(Path(sys.executable).parent / "chainweaver")
SECRET = "s3cret-pw"


async def working(calls: list[FlowServer], server: FlowServer) -> None:
    calls.append(server)  # what the worker command runs, not running it


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FlowServer]]:
    calls: list[FlowServer] = []
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(FlowServer, "serve", lambda self, *a, **k: calls.append(self))
    monkeypatch.setattr(FlowServer, "run_worker_async", lambda self: working(calls, self))
    yield calls


def unreachable() -> str:
    """A Redis URL with a password where nothing listens."""
    return f"redis://ops:{SECRET}@127.0.0.1:{free_port()}/0"


def test_a_worker_whose_queue_never_answers_exits_3_after_the_stated_wait() -> None:
    url = unreachable()
    started = time.monotonic()
    done = subprocess.run([CHAINWEAVER, "worker", *BASE, "--tasks", url, "--store-wait", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
    assert done.returncode == 3
    assert time.monotonic() - started < STARTUP_TIMEOUT  # it ends (it used to retry forever)
    assert SECRET not in done.stderr
    masked = url.replace(SECRET, "***")
    lines = done.stderr.splitlines()
    assert lines[0] == (f"chainweaver: cannot reach the task queue at {masked} yet "
                        f"({lines[0].split(' yet (')[1].split(');')[0]}); waiting up to 1 s "
                        "for it (--store-wait)")
    assert "ConnectionError" in lines[0] and "Connection refused" in lines[0]
    assert lines[-1].startswith(f"chainweaver: error: cannot reach the task queue at "
                                f"{masked} after waiting 1 s: ConnectionError: ")
    assert lines[-1].endswith("(--store-wait SECONDS sets how long)")
    assert "running task flows" not in done.stderr  # never claimed to run


@pytest.mark.parametrize(("flags", "store"), [
    (["--tasks"], "the task queue"),
    (["--run-history"], "the run history"),
    (["--governance"], "the governance state"),
    (["--rate-limit", "10", "--rate-limit-redis"], "the rate-limit counters"),
])
def test_serve_names_each_store_it_cannot_reach_and_never_serves(
    capsys: pytest.CaptureFixture, served: list, flags: list[str], store: str,
) -> None:
    url = unreachable()
    code, out, err = run(capsys, "serve", *BASE, *flags, url, "--store-wait", "0")
    assert (code, out, served) == (3, "", [])
    assert SECRET not in err
    assert f"cannot reach {store} at {url.replace(SECRET, '***')} after waiting 0 s: " \
           "ConnectionError" in err
    assert err.splitlines()[-1].startswith("chainweaver: error: ")


def test_one_redis_for_several_stores_is_named_once_with_all_it_holds(
    capsys: pytest.CaptureFixture, served: list,
) -> None:
    url = unreachable()
    code, _, err = run(capsys, "worker", *BASE, "--tasks", url, "--run-history", url,
                       "--store-wait", "0")
    assert code == 3
    assert "cannot reach the task queue and the run history at" in err


def test_a_store_that_comes_up_during_the_wait_is_used(capsys: pytest.CaptureFixture,
                                                       served: list) -> None:
    redis = RestartableRedis()
    starter = threading.Timer(1.0, redis.start)
    starter.start()
    try:
        code, _, err = run(capsys, "worker", *BASE, "--tasks", redis.url, "--store-wait",
                           str(STARTUP_TIMEOUT))
    finally:
        starter.join()
        redis.close()
    assert code == 0, err
    assert len(served) == 1
    assert f"cannot reach the task queue at {redis.url} yet (" in err
    assert f"chainweaver: reached the task queue at {redis.url}" in err
    assert err.splitlines()[-1] == f"chainweaver: running task flows from {redis.url}"


def test_a_store_that_refuses_the_password_is_not_waited_for(
    capsys: pytest.CaptureFixture, served: list, redis_url: str,
) -> None:
    url = redis_url.replace("redis://", f"redis://ops:{SECRET}@")
    started = time.monotonic()
    code, _, err = run(capsys, "serve", *BASE, "--run-history", url)  # the default wait
    assert (code, served) == (3, [])
    assert time.monotonic() - started < 20  # not the 30 s wait: waiting would not help
    assert SECRET not in err
    assert "cannot use the run history at redis://ops:***@" in err


def test_stores_in_memory_are_not_checked(capsys: pytest.CaptureFixture, served: list
                                          ) -> None:
    code, _, err = run(capsys, "serve", *BASE, "--tasks", "memory://", "--run-history",
                       "memory://", "--store-wait", "0")
    assert code == 0, err
    assert len(served) == 1


def test_while_serving_the_queues_outage_lines_name_it(capsys: pytest.CaptureFixture
                                                       ) -> None:
    from chainweaver.cli.stores import name_queue_outages

    url = f"redis://ops:{SECRET}@10.9.8.7:6379/0"
    docket = logging.getLogger("docket")
    before = list(docket.handlers)
    name_queue_outages(url)
    try:
        try:
            raise ConnectionError(f"Error 111 connecting with {SECRET}")
        except ConnectionError:
            logging.getLogger("docket.worker").warning(
                "Redis is unavailable, retrying in %s...", "0:00:01", exc_info=True)
        logging.getLogger("docket.strikelist").warning(
            "Redis is unavailable, sleeping for 1 second...")
    finally:
        for handler in docket.handlers[len(before):]:
            docket.removeHandler(handler)
    err = capsys.readouterr().err
    assert SECRET not in err
    assert err.splitlines() == [
        "chainweaver: the task queue at redis://ops:***@10.9.8.7:6379/0 is unreachable: "
        "ConnectionError: Error 111 connecting with *** (Redis is unavailable, retrying "
        "in 0:00:01...)",
        "chainweaver: the task queue at redis://ops:***@10.9.8.7:6379/0 is unreachable "
        "(Redis is unavailable, sleeping for 1 second...)"]


def test_the_documented_example_is_what_a_worker_prints() -> None:
    text = (ROOT / "docs" / "cli.md").read_text().split("### Redis stores at start-up")[1]
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    command, *expected = block.splitlines()
    assert command.startswith("$ chainweaver worker ")
    done = subprocess.run(["bash", "-c", command[2:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=STARTUP_TIMEOUT,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}"
                                                     f"{os.pathsep}{os.environ['PATH']}"})
    assert (done.stderr + done.stdout).splitlines() == expected
