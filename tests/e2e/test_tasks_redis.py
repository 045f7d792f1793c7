"""Background tasks scaled out on Redis: two server replicas, workers, real processes.

Everything is real and on 127.0.0.1: a private ``redis-server`` (the ``redis_url``
fixture), two ``chainweaver serve --tasks redis://... --task-concurrency 0`` replicas
(they only enqueue) and ``chainweaver worker`` processes (they run the flows). Callers
authenticate with static bearer tokens (``--auth-token-file``: line N is caller
``token-N``). Side effects are counted in Redis by the tools themselves
(tests/servers/task_tools.py), so a test sees every run in every process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp_tasks import ToolTask, call_tool_task
from mcp import MCPError
from support.procs import free_port, stop, wait_until_listening
from support.task_asks import by_hand, send_task_update

ROOT = Path(__file__).resolve().parents[2]
FLOWS = ROOT / "tests" / "servers" / "task_flows"
TOOLS = ROOT / "tests" / "servers" / "task_tools.py"
TOKENS = ("alice-token-0001", "bob-token-0002")
KEY = "a-test-encryption-key-of-32-chars!"
LIMIT = 60.0  # seconds: only to stop a hang
# Seconds: a dead worker's task goes to another worker soon, while a live worker on this
# busy 2-core machine still renews its leases in time (they are renewed every quarter).
REDELIVERY = "3"


@pytest.fixture(scope="module")
def queue(redis_url: str) -> str:
    """A Redis database of its own (the session's Redis is shared), emptied first."""
    url = redis_url.rsplit("/", 1)[0] + "/5"
    redis.Redis.from_url(url).flushdb()
    return url


def _env(queue: str, sleep: float = 0.0) -> dict[str, str]:
    return {**os.environ, "CW_TASK_REDIS": queue, "CW_TASK_SLEEP": str(sleep),
            "FASTMCP_TASKS_ENCRYPTION_KEY": KEY}


def _command(command: str, queue: str, *options: str) -> list[str]:
    # 100 clients polling one replica at once need more than redis-py's default pool of
    # 100 connections (docs/tasks.md): without it some tasks/get fail with -32603.
    return [sys.executable, "-m", "chainweaver", command, str(FLOWS), "--tools", str(TOOLS),
            "--side-effects", "read,write", "--approval", "elicit",
            "--tasks", f"{queue}?max_connections=1000", *options]


@pytest.fixture(scope="module")
def replicas(queue: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """Two enqueue-only server replicas on loopback; yields their ports. Their stderr is
    kept in replica-N.log next to the token file, for a failed run."""
    tokens = tmp_path_factory.mktemp("tasks") / "tokens.txt"
    tokens.write_text("\n".join(TOKENS) + "\n")
    tokens.chmod(0o600)
    started: list[tuple[subprocess.Popen, int]] = []
    logs = tokens.parent
    try:
        for index in range(2):
            port = free_port()
            with (logs / f"replica-{index}.log").open("w") as log:
                process = subprocess.Popen(
                    _command("serve", queue, "--transport", "streamable-http", "--port",
                             str(port), "--task-concurrency", "0", "--auth-token-file",
                             str(tokens)),
                    env=_env(queue), stdout=subprocess.DEVNULL, stderr=log)
            started.append((process, port))
        for process, port in started:
            wait_until_listening(process, port)
        yield [port for _, port in started]
    finally:
        for process, _ in started:
            stop(process)


class Workers:
    """``chainweaver worker`` processes started by one test, all stopped at its end."""

    def __init__(self, queue: str, logs: Path) -> None:
        self.queue = queue
        self.logs = logs  # each worker's stderr, kept for a failed run
        self.started: list[subprocess.Popen] = []

    def start(self, sleep: float = 0.0, ctrl_c_ignored: bool = False) -> subprocess.Popen:
        with (self.logs / f"worker-{len(self.started)}.log").open("w") as log:
            process = subprocess.Popen(
                _command("worker", self.queue, "--task-redelivery", REDELIVERY),
                env=_env(self.queue, sleep), stdout=subprocess.DEVNULL, stderr=log,
                # As a script's background job starts (SIGINT ignored), when asked.
                preexec_fn=_ignore_ctrl_c if ctrl_c_ignored else None)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            stop(process)


@pytest.fixture
def workers(queue: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(queue, tmp_path)
    try:
        yield started
    finally:
        started.stop_all()




def client(port: int, caller: int = 0) -> Client:
    """A caller's client; it declares elicitation, so its tasks may ask for approval."""
    transport = StreamableHttpTransport(
        f"http://127.0.0.1:{port}/mcp", headers={"Authorization": f"Bearer {TOKENS[caller]}"})
    return Client(transport, elicitation_handler=by_hand)


def handle(on: Client, task: ToolTask) -> ToolTask:
    """The same task id, asked through another connection (public ToolTask API)."""
    return ToolTask(on, task._tool_name, task.create_result)


async def final(task: ToolTask) -> Any:
    return await task.wait(timeout=LIMIT)


def count(queue: str, key: str) -> int:
    return int(redis.Redis.from_url(queue).get(f"cw-test:{key}") or 0)


# ---------------------------------------------------------------------------- tests


@pytest.mark.anyio
async def test_a_task_created_on_one_replica_is_answered_by_the_other(
        replicas: list[int], workers: Workers, queue: str) -> None:
    workers.start()
    async with client(replicas[0]) as on_a, client(replicas[1]) as on_b:
        task = await call_tool_task(on_a, "report", {"n": 2})
        done = await final(handle(on_b, task))
        result = await handle(on_b, task).result()
    assert done.status == "completed"
    assert result.structured_content == {"n": 31}
    # The stored request context (the caller's token and headers) is encrypted.
    stored = redis.Redis.from_url(queue)
    snapshots = [stored.get(key) for key in stored.scan_iter("*:snapshot")]
    assert snapshots and all(value and value.startswith(b"gAAAAA") for value in snapshots)
    assert not any(TOKENS[0].encode() in (value or b"") for value in snapshots)


@pytest.mark.anyio
async def test_another_caller_cannot_see_or_cancel_a_task(
        replicas: list[int], workers: Workers) -> None:
    async with client(replicas[0], caller=0) as alice, \
            client(replicas[1], caller=1) as bob:
        task = await call_tool_task(alice, "report", {"n": 1})
        answers = []
        for probe in (handle(bob, task).status, handle(bob, task).cancel,
                      lambda: send_task_update(bob, task.task_id)):
            with pytest.raises(MCPError) as refused:
                await probe()
            answers.append((refused.value.error.code, refused.value.error.message))
        unknown = ToolTask(bob, "report", task.create_result.model_copy(
            update={"task_id": "x" * len(task.task_id)}))
        with pytest.raises(MCPError) as missing:
            await unknown.status()
        workers.start()
        mine = await final(handle(alice, task))
    expected = (-32602, f"Task {task.task_id} not found")
    assert answers == [expected, expected, expected]
    assert (missing.value.error.code,
            missing.value.error.message.replace("x" * len(task.task_id), task.task_id)) == \
        expected
    assert mine.status == "completed"  # bob's cancel did nothing


@pytest.mark.anyio
async def test_two_hundred_tasks_over_two_replicas_and_two_workers_all_complete(
        replicas: list[int], workers: Workers) -> None:
    workers.start()
    workers.start()
    async with client(replicas[0]) as on_a, client(replicas[1]) as on_b:
        tasks = [await call_tool_task((on_a, on_b)[i % 2], "report", {"n": i})
                 for i in range(200)]
        results = await asyncio.gather(*(
            asyncio.wait_for(handle((on_b, on_a)[i % 2], task).result(), LIMIT)
            for i, task in enumerate(tasks)))
    assert [r.structured_content for r in results] == [{"n": (i + 1) * 10 + 1}
                                                       for i in range(200)]


@pytest.mark.anyio
async def test_a_killed_worker_loses_no_task_and_repeats_no_side_effect(
        replicas: list[int], workers: Workers, queue: str) -> None:
    doomed = workers.start(sleep=3.0)  # long enough to die mid-run
    async with client(replicas[0]) as on_a, client(replicas[1]) as on_b:
        charge = await call_tool_task(on_a, "charge_order", {"order": "K-1"})
        lookup = await call_tool_task(on_b, "lookup_order", {"order": "K-1"})
        for _ in range(int(LIMIT / 0.05)):  # both runs have started their side effect
            if count(queue, "charge:K-1") and count(queue, "lookup:K-1"):
                break
            await asyncio.sleep(0.05)
        assert count(queue, "charge:K-1") == 1 and count(queue, "lookup:K-1") == 1
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=LIMIT)
        queued = [await call_tool_task((on_a, on_b)[i % 2], "report", {"n": i})
                  for i in range(10)]  # created while no worker runs
        workers.start(sleep=0.2)
        charged = await final(handle(on_b, charge))
        looked = await final(handle(on_a, lookup))
        later = [await final(task) for task in queued]
    assert charged.status == "failed"
    assert "not idempotent" in (charged.status_message or "")
    assert count(queue, "charge:K-1") == 1  # never charged twice
    assert looked.status == "completed"  # idempotent: run again on the other worker
    assert count(queue, "lookup:K-1") == 2
    assert [task.status for task in later] == ["completed"] * 10


@pytest.mark.anyio
async def test_a_task_cancelled_on_one_replica_stops_on_the_worker(
        replicas: list[int], workers: Workers, queue: str) -> None:
    run_for = 5.0
    workers.start(sleep=run_for)
    async with client(replicas[0]) as on_a, client(replicas[1]) as on_b:
        task = await call_tool_task(on_a, "lookup_order", {"order": "C-1"})
        for _ in range(int(LIMIT / 0.05)):
            if count(queue, "lookup:C-1"):
                break
            await asyncio.sleep(0.05)
        started = time.monotonic()  # the run started before this
        await handle(on_b, task).cancel()
        done = await final(handle(on_a, task))
        # Until a second after the run would have ended (counted from when it was seen
        # started, which is after it started), however long the cancel took.
        await asyncio.sleep(max(0.0, started + run_for + 1.0 - time.monotonic()))
        follow = await final(await call_tool_task(on_b, "report", {"n": 0}))
    assert done.status == "cancelled"
    assert count(queue, "lookup:C-1") == 1
    assert count(queue, "lookup-finished:C-1") == 0  # the run stopped on the worker
    assert follow.status == "completed"  # and the worker keeps serving


@pytest.mark.anyio
async def test_an_approval_answered_on_another_replica_runs_on_another_worker(
        replicas: list[int], workers: Workers, queue: str) -> None:
    """The ask is kept in Redis, not in a process: the answer reaches the task through
    either replica, and the answered leg runs on a worker that did not ask (whose
    request-state secrets differ from the first worker's)."""
    first = workers.start()
    async with client(replicas[0]) as on_a, client(replicas[1]) as on_b:
        task = await call_tool_task(on_a, "refund_order", {"order": "R-1"})
        asked = await handle(on_b, task).wait(state="input_required", timeout=LIMIT)
        assert asked.input_requests and count(queue, "refund:R-1") == 0
        stop(first)
        workers.start()
        await send_task_update(on_b, task.task_id, {key: {"action": "accept",
                                               "content": {"approve": True}}
                                         for key in asked.input_requests})
        done = await final(handle(on_a, task))
        result = await handle(on_a, task).result()
    assert done.status == "completed"
    assert result.structured_content == {"order": "R-1", "count": 1}
    assert count(queue, "refund:R-1") == 1


# ------------------------------------------------ in process: FlowServer.run_worker_async


def _in_process_server(queue: str, version: str, concurrency: int | None,
                       flows: tuple[str, ...] = ("report",), **options: Any) -> Any:
    import dataclasses

    sys.path.insert(0, str(TOOLS.parent))
    import task_tools

    from chainweaver import FlowExecutor, FlowRegistry
    from chainweaver.files import find_flow_files, load_flows
    from chainweaver.mcp import FlowServer, TaskSettings

    executor = FlowExecutor(FlowRegistry())
    for tool in (task_tools.fetch, task_tools.enrich, task_tools.finish, task_tools.refund):
        executor.register_tool(tool)
    for flow in load_flows(find_flow_files([FLOWS / f"{name}.flow.yaml" for name in flows]),
                           tools=executor.tools):
        executor.registry.register_flow(dataclasses.replace(flow, version=version))
    return FlowServer(executor,
                      tasks=TaskSettings(url=queue, concurrency=concurrency, name="cw-inproc"),
                      **options)


@pytest.mark.anyio
async def test_a_worker_runs_only_the_flow_version_the_task_was_created_for(
        queue: str) -> None:
    replica = _in_process_server(queue, "1.0.0", concurrency=0)
    async with Client(replica.fastmcp) as on_replica:
        for version, expected in (("2.0.0", "failed"), ("1.0.0", "completed")):
            worker = asyncio.create_task(
                _in_process_server(queue, version, None).run_worker_async())
            try:
                task = await call_tool_task(on_replica, "report", {"n": 1})
                done = await final(task)
            finally:
                worker.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await worker
            assert done.status == expected, version
            if expected == "failed":
                assert done.status_message == ("flow 'report' version 1.0.0 is no longer "
                                               "published here; the task did not run")


@pytest.mark.anyio
async def test_a_worker_that_would_not_ask_for_approval_does_not_run_the_task(
        queue: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from chainweaver.mcp import ExposurePolicy

    monkeypatch.setenv("CW_TASK_REDIS", queue)  # the tool counts its runs in Redis

    write = ["read", "write"]
    replica = _in_process_server(queue, "1.0.0", 0, ("refund",), policy=ExposurePolicy(
        allowed_side_effects=write, approval="elicit"))
    careless = _in_process_server(queue, "1.0.0", None, ("refund",), policy=ExposurePolicy(
        allowed_side_effects=write, allow_requires_approval=True))
    async with Client(replica.fastmcp) as on_replica:
        worker = asyncio.create_task(careless.run_worker_async())
        try:
            task = await call_tool_task(on_replica, "refund_order", {"order": "W-1"})
            done = await final(task)
        finally:
            worker.cancel()
            with pytest.raises(asyncio.CancelledError):
                await worker
    assert done.status == "failed"
    assert done.status_message == (
        "flow 'refund_order' asks for approval where the task was created, but not on "
        "this worker (start it with --approval elicit); the task did not run")
    assert count(queue, "refund:W-1") == 0


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.anyio
@pytest.mark.parametrize("ctrl_c_ignored", [False, True])
async def test_a_worker_stopped_with_sigterm_finishes_its_run_and_exits_0(
        replicas: list[int], workers: Workers, queue: str, ctrl_c_ignored: bool) -> None:
    # Service and container managers stop a worker with SIGTERM: like Ctrl-C, it
    # finishes the run it holds (no other worker is started to take the task over).
    # Also when it was started with Ctrl-C ignored (a script's background job): it
    # then abandoned the run.
    stopping = workers.start(sleep=2.0, ctrl_c_ignored=ctrl_c_ignored)
    key = f"charge:T-{int(ctrl_c_ignored)}"
    async with client(replicas[0]) as on_a:
        charge = await call_tool_task(on_a, "charge_order",
                                      {"order": f"T-{int(ctrl_c_ignored)}"})
        for _ in range(int(LIMIT / 0.05)):  # the run has started its side effect
            if count(queue, key):
                break
            await asyncio.sleep(0.05)
        stopping.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(stopping.wait, LIMIT)
        done = await final(charge)
    assert code == 0
    assert done.status == "completed"
    assert count(queue, key) == 1


@pytest.mark.anyio
async def test_a_worker_started_with_ctrl_c_ignored_keeps_ignoring_it(
        replicas: list[int], workers: Workers, queue: str) -> None:
    # A script's background job starts with Ctrl-C ignored so that a Ctrl-C in the
    # terminal does not reach it (Python itself keeps such a SIGINT ignored). The
    # worker put the default handler back for as long as it ran: a Ctrl-C stopped it.
    working = workers.start(sleep=1.0, ctrl_c_ignored=True)
    async with client(replicas[0]) as on_a:
        charge = await call_tool_task(on_a, "charge_order", {"order": "I-1"})
        for _ in range(int(LIMIT / 0.05)):  # the run has started its side effect
            if count(queue, "charge:I-1"):
                break
            await asyncio.sleep(0.05)
        working.send_signal(signal.SIGINT)
        assert (await final(charge)).status == "completed"
        with pytest.raises(subprocess.TimeoutExpired):  # it did not stop
            await asyncio.to_thread(working.wait, 2.0)
        again = await call_tool_task(on_a, "charge_order", {"order": "I-2"})
        assert (await final(again)).status == "completed"
        working.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(working.wait, LIMIT)
    assert code == 0
    assert count(queue, "charge:I-2") == 1
