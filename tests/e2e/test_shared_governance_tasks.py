"""Background tasks under shared governance (issue 25), on a real Redis for both the
governance state and the task queue (Docket).

What docs/tasks.md ("A task lives in its flow's view", "Retiring a flow") and
docs/live-governance.md ("Background tasks") promise for a flow an operator archives
through the shared state, exactly as for a local change:

- a run already under way finishes (the step that was running, then the rest of the
  run), its result is kept but ``tasks/get`` / ``tasks/cancel`` answer exactly like an
  unknown id while the flow is out of the view (and serve it again once it is back);
- once the change is applied, no task of that flow can be created (refused exactly like
  an unknown tool), and a task queued before the change runs no step: the worker fails
  it with "no longer published here";
- the same on a separate ``chainweaver worker --governance`` process.

Replicas and the in-process worker are FlowServers in this process (each its own
registry and shared-governance follower); the last test runs a real worker process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from docket.execution import ExecutionState
from fastmcp import Client
from fastmcp_tasks import ToolTask, call_tool_task
from fastmcp_tasks.handlers import _lookup_task
from mcp import MCPError
from pydantic import BaseModel
from support import polling
from support.procs import stop

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.governance import GovernanceSettings, GovernanceStore
from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig, TaskSettings
from chainweaver.mcp.fastmcp_seams import running_docket

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.tasks]

ROOT = Path(__file__).resolve().parents[2]
TASK_FLOWS = ROOT / "tests" / "servers" / "task_flows"
TASK_TOOLS = ROOT / "tests" / "servers" / "task_tools.py"
LIMIT = 20.0  # seconds: only to stop a hang, never a speed requirement
FLOW = "two_step"
SLOW_READ = 0.5  # seconds a slowed read of the shared state takes
GONE = (f"flow {FLOW!r} version 1.0.0 is no longer published here; the task did not run")

# What the in-process steps did, and the gate the first step waits at.
RAN: Counter[str] = Counter()
GATE: dict[str, asyncio.Event] = {}


class Number(BaseModel):
    n: int


@tool(safety=ToolSafetyContract(SideEffectLevel.READ))
async def hold(n: int) -> Number:
    """The first step: counts itself, then waits until the test opens the gate."""
    RAN["hold"] += 1
    await GATE["open"].wait()
    RAN["hold-finished"] += 1
    return Number(n=n + 1)


@tool(safety=ToolSafetyContract(SideEffectLevel.READ))
async def after(n: int) -> Number:
    """The second step."""
    RAN["after"] += 1
    return Number(n=n * 10)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    RAN.clear()
    GATE["open"] = asyncio.Event()
    yield
    GATE["open"].set()


@pytest.fixture(scope="module")
def queue(redis_url: str) -> str:
    """The task queue's Redis database (the session's Redis is shared), emptied first;
    each in-process test uses a queue name of its own on it."""
    url = redis_url.rsplit("/", 1)[0] + "/9"
    redis.Redis.from_url(url).flushdb()
    return url


def governance(redis_url: str) -> GovernanceSettings:
    return GovernanceSettings(url=redis_url, prefix=f"test:{uuid.uuid4().hex}",
                              confirm_interval=0.2, heartbeat_interval=0.2)


def flow_server(queue: str, name: str, shared: GovernanceSettings | None, *,
                concurrency: int | None = None,
                audit: list[AuditEvent] | None = None) -> FlowServer:
    """A replica (``concurrency=0``: it only enqueues) or a worker, with its own registry."""
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(hold)
    executor.register_tool(after)
    executor.registry.register_flow(Flow(FLOW, "Hold, then go on.",
                                         [FlowStep("hold"), FlowStep("after")],
                                         task_mode="required"))
    return FlowServer(executor, tasks=TaskSettings(url=queue, concurrency=concurrency,
                                                   name=name),
                      security=SecurityConfig(audit_hook=audit.append
                                              if audit is not None else None),
                      governance=shared)


@asynccontextmanager
async def working(worker: FlowServer) -> AsyncIterator[None]:
    """``FlowServer.run_worker_async`` (as ``chainweaver worker`` runs) meanwhile."""
    running = asyncio.create_task(worker.run_worker_async())
    try:
        yield
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


until = partial(polling.until, limit=LIMIT)


def applied(server: FlowServer) -> int:
    """The shared version the server's follower applied last (-1: not synced yet)."""
    follower = server._shared.follower  # type: ignore[union-attr]
    return follower.version if follower.confirmed is not None else -1


async def all_applied(version: int, *servers: FlowServer) -> None:
    async def done() -> bool:
        return all(applied(server) >= version for server in servers)

    await until(done, f"every process to apply shared version {version}")


async def refusal(request: Any) -> tuple[int, str]:
    """The JSON-RPC error a task request gets."""
    with pytest.raises(MCPError) as refused:
        await request()
    return refused.value.error.code, refused.value.error.message


def other_id(task: ToolTask, task_id: str) -> ToolTask:
    return ToolTask(task._client, task._tool_name,
                    task.create_result.model_copy(update={"task_id": task_id}))


async def answers_like_an_unknown_id(task: ToolTask) -> None:
    """tasks/get and tasks/cancel answer exactly as for an id never issued."""
    never = "A" * len(task.task_id)
    for method in (ToolTask.status, ToolTask.cancel):
        mine = await refusal(lambda m=method: m(task))
        unknown = await refusal(lambda m=method: m(other_id(task, never)))
        assert mine == (-32602, f"Task {task.task_id} not found")
        assert unknown == (-32602, f"Task {never} not found")


async def creation_error(client: Client, name: str) -> tuple[type, str]:
    try:
        await call_tool_task(client, name, {"n": 1})
    except Exception as error:  # noqa: BLE001 - the type and text are what is compared
        return type(error), str(error).replace(name, "NAME")
    raise AssertionError(f"a task for {name} was created")


async def stored(replica: FlowServer, task: ToolTask) -> tuple[str, Any]:
    """The task as the backend keeps it, read from Docket (no view): its state, and
    the result's structured content or the failure's message."""
    docket = running_docket(replica.fastmcp)
    execution = (await _lookup_task(docket, None, task.task_id))[0]  # anonymous scope
    await execution.sync()
    if execution.state == ExecutionState.COMPLETED:
        result = await execution.get_result(timeout=timedelta(seconds=0))
        # An error result has no structured content: its text says what went wrong.
        return "completed", result.structured_content or result.content
    if execution.state == ExecutionState.FAILED:
        with pytest.raises(MCPError) as failure:
            await execution.get_result(timeout=timedelta(seconds=0))
        return "failed", failure.value.error.message
    return execution.state.value, None


async def finished(replica: FlowServer, task: ToolTask) -> tuple[str, Any]:
    async def ended() -> tuple[str, Any] | None:
        state = await stored(replica, task)
        return state if state[0] in ("completed", "failed", "cancelled") else None

    return await until(ended, "the task to end")


def task_states(audit: list[AuditEvent], task: ToolTask) -> list[tuple[str, str | None]]:
    return [(e.phase, e.task_status) for e in audit
            if e.kind == "task" and e.task_id == task.task_id and e.task_status]


def refusals(audit: list[AuditEvent], task: ToolTask) -> list[tuple[Any, ...]]:
    """Every task record of ``task`` a worker wrote, as (phase, task_status, decision,
    reason):
    a worker that refused the task wrote only its refusal."""
    return [(e.phase, e.task_status, e.decision, e.reason) for e in audit
            if e.kind == "task" and e.task_id == task.task_id and e.task_status]


# ---------------------------------------------------------------------------- tests


async def test_a_run_under_way_when_its_flow_is_archived_finishes_out_of_view(
        redis_url: str, queue: str) -> None:
    shared = governance(redis_url)
    store = GovernanceStore(shared.url, shared.prefix)
    name = f"q-{uuid.uuid4().hex[:8]}"
    audit: list[AuditEvent] = []
    replica = flow_server(queue, name, shared, concurrency=0)
    worker = flow_server(queue, name, shared, audit=audit)
    try:
        async with working(worker), Client(replica.fastmcp) as client:
            await all_applied(0, replica, worker)
            task = await call_tool_task(client, FLOW, {"n": 1})

            async def holding() -> bool:
                status = await task.status()
                assert status.status == "working", status  # fail fast, saying why
                return status.status_message == "step 1/2 hold"

            await until(holding, "the first step to run")
            change = await store.change(FLOW, None, "archived", by="ops", reason="INC-1")
            await all_applied(change.version, replica, worker)
            # While it runs: out of the view, so answered (and not cancelled) like an
            # unknown id, and no new task of the flow can be created.
            await answers_like_an_unknown_id(task)
            assert await creation_error(client, FLOW) == \
                await creation_error(client, "never_existed")
            assert RAN == {"hold": 1}
            GATE["open"].set()
            done = await finished(replica, task)
            # The run went on to its end: the running step once, then the rest.
            assert RAN == {"hold": 1, "hold-finished": 1, "after": 1}
            assert done == ("completed", {"n": 20})  # the result is kept
            assert task_states(audit, task) == [("state", "working"),
                                                ("completed", "completed")]
            await answers_like_an_unknown_id(task)  # but not served
            # Back in the view (the same version active again): served as kept.
            change = await store.change(FLOW, None, "active", by="ops")
            await all_applied(change.version, replica, worker)
            assert (await task.status()).status == "completed"
            result = await asyncio.wait_for(task.result(), LIMIT)
            assert result.structured_content == {"n": 20}
        assert RAN == {"hold": 1, "hold-finished": 1, "after": 1}
    finally:
        await store.aclose()


async def test_a_task_queued_before_the_archive_never_runs_a_step(
        redis_url: str, queue: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The replica only enqueues; the worker starts after the change was made, and its
    first read of the shared state is slow (a busy Redis): its Docket worker must not
    take the task before that read was applied."""
    shared = governance(redis_url)
    store = GovernanceStore(shared.url, shared.prefix)
    name = f"q-{uuid.uuid4().hex[:8]}"
    audit: list[AuditEvent] = []
    replica = flow_server(queue, name, shared, concurrency=0)
    try:
        async with Client(replica.fastmcp) as client:
            await all_applied(0, replica)
            task = await call_tool_task(client, FLOW, {"n": 1})  # queued: no worker yet
            assert (await task.status()).status == "working"
            change = await store.change(FLOW, None, "archived", by="ops")
            await all_applied(change.version, replica)
            await answers_like_an_unknown_id(task)
            assert await creation_error(client, FLOW) == \
                await creation_error(client, "never_existed")
            GATE["open"].set()  # a step that started would not block
            read = GovernanceStore.read

            async def slow_read(self: GovernanceStore) -> Any:
                await asyncio.sleep(SLOW_READ)
                return await read(self)

            monkeypatch.setattr(GovernanceStore, "read", slow_read)
            worker = flow_server(queue, name, shared, audit=audit)
            async with working(worker):
                done = await finished(replica, task)
                seen = applied(worker)
        assert done == ("failed", GONE)
        assert RAN == {}  # no step ran
        # The worker never started a leg of it: it audited only its refusal.
        assert refusals(audit, task) == [("state", "failed", "denied",
                                            "flow_unavailable")]
        assert seen >= change.version  # and it did apply the change
    finally:
        await store.aclose()


async def test_a_worker_that_applied_the_archive_refuses_a_task_from_a_lagging_replica(
        redis_url: str, queue: str) -> None:
    """A replica that has not applied the change (here: one that follows no shared
    state) still enqueues; the worker that applied it fails the task unrun."""
    shared = governance(redis_url)
    store = GovernanceStore(shared.url, shared.prefix)
    name = f"q-{uuid.uuid4().hex[:8]}"
    audit: list[AuditEvent] = []
    lagging = flow_server(queue, name, None, concurrency=0)
    worker = flow_server(queue, name, shared, audit=audit)
    GATE["open"].set()
    try:
        async with working(worker), Client(lagging.fastmcp) as client:
            await all_applied(0, worker)
            before = await call_tool_task(client, FLOW, {"n": 2})
            assert await finished(lagging, before) == ("completed", {"n": 30})  # it ran
            change = await store.change(FLOW, None, "archived", by="ops")
            await all_applied(change.version, worker)
            task = await call_tool_task(client, FLOW, {"n": 3})
            done = await finished(lagging, task)
            assert (await task.status()).status == "failed"  # the lagging replica's view
        assert done == ("failed", GONE)
        assert RAN == {"hold": 1, "hold-finished": 1, "after": 1}  # the first task only
        assert refusals(audit, task) == [("state", "failed", "denied",
                                            "flow_unavailable")]
    finally:
        await store.aclose()


# ------------------------------------------------------ a chainweaver worker process


@pytest.fixture
def worker_queue(redis_url: str) -> str:
    """A database of its own: ``chainweaver worker`` uses the default queue name."""
    url = redis_url.rsplit("/", 1)[0] + "/10"
    redis.Redis.from_url(url).flushdb()
    return url


def task_server(queue: str) -> FlowServer:
    """An enqueue-only replica of tests/servers/task_flows, following no shared state."""
    sys.path.insert(0, str(TASK_TOOLS.parent))
    import task_tools

    from chainweaver.files import find_flow_files, load_flows

    executor = FlowExecutor(FlowRegistry())
    for one in (task_tools.fetch, task_tools.enrich, task_tools.finish, task_tools.lookup):
        executor.register_tool(one)
    for flow in load_flows(find_flow_files([TASK_FLOWS / "lookup.flow.yaml"]),
                           tools=executor.tools):
        executor.registry.register_flow(flow)
    return FlowServer(executor, tasks=TaskSettings(url=queue, concurrency=0))


@pytest.mark.parametrize("withdrawn", [False, True])
async def test_a_worker_started_while_the_state_cannot_be_read_takes_no_task_until_it_can(
        queue: str, withdrawn: bool) -> None:
    """The governance Redis is down when the worker starts (its task queue is not).
    It has read no state, so it cannot tell a flow operators withdrew from one they
    did not: it ran every task it took as defined (a withdrawn flow's included). Now
    it takes none, and fails none, until it read the state: then a task of a flow
    still published runs (nothing is lost meanwhile), and one of a withdrawn flow does
    not."""
    from support.shared_governance import RestartableRedis

    governance_redis = RestartableRedis()
    governance_redis.start()
    name = f"q-{uuid.uuid4().hex[:8]}"
    GATE["open"].set()
    try:
        shared = governance(governance_redis.url)
        store = GovernanceStore(shared.url, shared.prefix)
        if withdrawn:
            await store.change(FLOW, None, "withdrawn", by="ops")
        await store.aclose()
        governance_redis.stop()
        enqueuer = flow_server(queue, name, None, concurrency=0)  # follows no state
        worker = flow_server(queue, name, shared)
        async with Client(enqueuer.fastmcp) as client:
            task = await call_tool_task(client, FLOW, {"n": 4})
            async with working(worker):
                follower = worker._shared.follower  # type: ignore[union-attr]

                async def tried() -> bool:
                    return follower.outage_since is not None

                await until(tried, "the worker's first attempt to read the state")
                await asyncio.sleep(1.0)  # time enough to have taken the task
                assert (await stored(enqueuer, task))[0] in ("scheduled", "queued")
                assert RAN == {}
                governance_redis.start()
                done = await finished(enqueuer, task)
        if withdrawn:
            assert (done, RAN) == (("failed", GONE), {})
        else:
            assert done == ("completed", {"n": 50})
            assert RAN == {"hold": 1, "hold-finished": 1, "after": 1}
    finally:
        governance_redis.close()


async def test_a_worker_that_stopped_serving_for_want_of_the_state_fails_no_task(
        queue: str) -> None:
    """The worker applied the state, then lost its governance Redis (its task queue is
    still there) for longer than ``stop_serving_after``: it serves no flow. A task it
    takes then was failed for good ("no longer published here"), though its flow
    was published all along. Now it waits, running no step, and runs once the state
    is read again."""
    from support.shared_governance import RestartableRedis

    governance_redis = RestartableRedis()
    governance_redis.start()
    name = f"q-{uuid.uuid4().hex[:8]}"
    GATE["open"].set()
    try:
        shared = dataclasses.replace(governance(governance_redis.url),
                                     stop_serving_after=0.2)
        enqueuer = flow_server(queue, name, None, concurrency=0)  # follows no state
        worker = flow_server(queue, name, shared)
        follower = worker._shared.follower  # type: ignore[union-attr]
        async with working(worker), Client(enqueuer.fastmcp) as client:
            await all_applied(0, worker)
            governance_redis.stop()

            async def suspended() -> bool:
                return follower.overlay.suspended

            await until(suspended, "the worker to stop serving")
            task = await call_tool_task(client, FLOW, {"n": 5})

            async def waiting() -> bool:
                return (await task.status()).status_message == "waiting for the shared " \
                    "governance state"

            await until(waiting, "the worker to take the task and wait")
            assert RAN == {}
            governance_redis.start()
            done = await finished(enqueuer, task)
        assert done == ("completed", {"n": 60})
        assert RAN == {"hold": 1, "hold-finished": 1, "after": 1}
    finally:
        governance_redis.close()


async def test_a_chainweaver_worker_process_refuses_an_archived_flow(
        redis_url: str, worker_queue: str, tmp_path: Path) -> None:
    """A task queued before the archive while no worker ran, and a task a lagging
    replica creates after it: the worker process that applied the change runs neither."""
    shared = governance(redis_url)
    store = GovernanceStore(shared.url, shared.prefix)
    replica = task_server(worker_queue)
    counts = redis.Redis.from_url(worker_queue)
    log = tmp_path / "worker.log"
    process: subprocess.Popen | None = None
    try:
        async with Client(replica.fastmcp) as client:
            queued = await call_tool_task(client, "lookup_order", {"order": "Q-1"})
            change = await store.change("lookup_order", None, "archived", by="ops")
            with log.open("w") as err:
                process = subprocess.Popen(
                    [sys.executable, "-m", "chainweaver", "worker", str(TASK_FLOWS),
                     "--tools", str(TASK_TOOLS), "--tasks", worker_queue,
                     "--governance", shared.url, "--governance-prefix", shared.prefix],
                    env={**os.environ, "CW_TASK_REDIS": worker_queue},
                    stdout=subprocess.DEVNULL, stderr=err)

            async def worker_applied() -> bool:
                assert process is not None and process.poll() is None, log.read_text()
                beats = await store.heartbeats()
                return any(beat["role"] == "worker" and beat["version"] >= change.version
                           for beat in beats.values())

            await until(worker_applied, "the worker process to apply the archive")
            first = await finished(replica, queued)
            later = await call_tool_task(client, "lookup_order", {"order": "Q-2"})
            second = await finished(replica, later)
        gone = ("flow 'lookup_order' version 1.0.0 is no longer published here; the task "
                "did not run")
        assert first == ("failed", gone), log.read_text()
        assert second == ("failed", gone), log.read_text()
        assert counts.get("cw-test:lookup:Q-1") is None
        assert counts.get("cw-test:lookup:Q-2") is None
    finally:
        if process is not None:
            stop(process)
        await store.aclose()
