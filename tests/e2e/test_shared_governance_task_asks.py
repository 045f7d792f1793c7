"""A background task that waits for approval while an operator withdraws its flow
through the shared governance state, on a real Redis (the governance state and the
task queue): one replica that only enqueues, one worker, both following the state.

While the flow is out of service, the waiting task answers ``tasks/get``,
``tasks/update`` and ``tasks/cancel`` exactly like an id never issued, and its run
record reads like a run that never existed; an answer sent meanwhile is not taken.
Once the flow is back, the task still waits, takes an answer and runs its step once.
A task the worker refuses (its flow archived before it ran) ends its run's record
``failed``, not ``running`` for good.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
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
from support.task_asks import answering, reply, update_task, waiting

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
from chainweaver.mcp import ExposurePolicy, FlowServer, TaskSettings
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.fastmcp_seams import running_docket

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.tasks]

LIMIT = 20.0  # seconds: only to stop a hang, never a speed requirement
FLOW = "refund_order"
REFUNDED: list[str] = []
until = partial(polling.until, limit=LIMIT)


class Refund(BaseModel):
    order: str


@tool(safety=ToolSafetyContract(SideEffectLevel.WRITE, requires_approval=True,
                                approval_reason="sends money back"))
async def refund(order: str) -> Refund:
    REFUNDED.append(order)
    return Refund(order=order)


@pytest.fixture
def queue(redis_url: str) -> Iterator[str]:
    """The task queue's database, emptied, and the run history's (/12), emptied too."""
    url = redis_url.rsplit("/", 1)[0] + "/11"
    for database in (url, redis_url.rsplit("/", 1)[0] + "/12"):
        redis.Redis.from_url(database).flushdb()
    REFUNDED.clear()
    yield url


def process(queue: str, name: str, governance: GovernanceSettings, history: str, *,
            concurrency: int | None = None) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(refund)
    executor.registry.register_flow(Flow(FLOW, "Refund an order.", [FlowStep("refund")],
                                         task_mode="required"))
    return FlowServer(executor, tasks=TaskSettings(url=queue, concurrency=concurrency,
                                                   name=name),
                      policy=ExposurePolicy(allowed_side_effects=["read", "write"],
                                            approval="elicit"),
                      run_history=RunHistory(store=history), governance=governance)


@asynccontextmanager
async def working(worker: FlowServer) -> AsyncIterator[None]:
    running = asyncio.create_task(worker.run_worker_async())
    try:
        yield
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


async def refused(request: object) -> tuple[int, str]:
    with pytest.raises(MCPError) as error:
        await request()  # type: ignore[operator]
    return error.value.error.code, error.value.error.message


def never_issued(task: ToolTask) -> ToolTask:
    return ToolTask(task._client, task._tool_name, task.create_result.model_copy(
        update={"task_id": "A" * len(task.task_id)}))


async def test_a_waiting_task_of_a_withdrawn_flow_answers_like_one_never_issued(
        redis_url: str, queue: str) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    governance = GovernanceSettings(url=redis_url, prefix=prefix, confirm_interval=0.2,
                                    heartbeat_interval=0.2)
    history = redis_url.rsplit("/", 1)[0] + "/12"
    store = GovernanceStore(redis_url, prefix)
    name = f"q-{uuid.uuid4().hex[:8]}"
    replica = process(queue, name, governance, history, concurrency=0)
    worker = process(queue, name, governance, history)
    try:
        async with working(worker), answering(replica) as client:
            task = await call_tool_task(client, FLOW, {"order": "A-17"})
            requests = await waiting(task)
            listed = await client.read_resource("chainweaver://runs")
            assert '"waiting_approval"' in listed[0].text
            run_uri = "chainweaver://runs/" + listed[0].text.split('"run_id": "')[1][:24]
            for decision in ("withdrawn", "archived"):
                change = await store.change(FLOW, None, decision, by="ops")
                await until(lambda v=change.version: _applied(v, replica, worker),
                            f"both processes to apply {decision}")
                other = never_issued(task)
                for method in (ToolTask.status, ToolTask.cancel):
                    assert await refused(lambda m=method: m(task)) == \
                        (-32602, f"Task {task.task_id} not found")
                    assert await refused(lambda m=method, o=other: m(o)) == \
                        (-32602, f"Task {other.task_id} not found")
                answer = reply(requests, "accept", {"approve": True})
                assert await refused(lambda a=answer: update_task(task, a)) == \
                    (-32602, f"Task {task.task_id} not found")
                never = "chainweaver://runs/" + "0" * 24
                mine = await refused(lambda: client.read_resource(run_uri))
                assert mine == (-32602, f"Resource not found: {run_uri!r}")
                assert await refused(lambda n=never: client.read_resource(n)) == \
                    (-32602, f"Resource not found: {never!r}")
                assert '"runs": []' in (await client.read_resource(
                    "chainweaver://runs"))[0].text
                assert REFUNDED == []
            change = await store.change(FLOW, None, "active", by="ops")
            await until(lambda: _applied(change.version, replica, worker), "activation")
            assert (await task.status()).status == "input_required"  # still waiting
            await update_task(task, reply(requests, "accept", {"approve": True}))
            result = await asyncio.wait_for(task.result(), LIMIT)
            assert result.structured_content == {"order": "A-17"}
        assert REFUNDED == ["A-17"]
    finally:
        await store.aclose()


async def _applied(version: int, *servers: FlowServer) -> bool:
    return all(s._shared.follower.version >= version  # type: ignore[union-attr]
               for s in servers)


async def test_a_task_its_worker_refuses_ends_its_run_record_failed(
        redis_url: str, queue: str) -> None:
    """A task queued before an operator archived its flow: the worker that applied the
    archive fails it unrun, and its run's record (on the shared history) ends
    ``failed`` with ``FlowUnavailable``; it used to say ``running`` for good. Unreadable
    while the flow is out of service, it reads so once the flow is back."""
    prefix = f"test:{uuid.uuid4().hex}"
    governance = GovernanceSettings(url=redis_url, prefix=prefix, confirm_interval=0.2,
                                    heartbeat_interval=0.2)
    history = redis_url.rsplit("/", 1)[0] + "/12"
    store = GovernanceStore(redis_url, prefix)
    name = f"q-{uuid.uuid4().hex[:8]}"
    replica = process(queue, name, governance, history, concurrency=0)
    try:
        async with answering(replica) as client:
            task = await call_tool_task(client, FLOW, {"order": "B-2"})  # no worker yet
            (queued,) = await _runs(client)
            assert (queued["status"], queued["task_id"]) == ("running", task.task_id)
            change = await store.change(FLOW, None, "archived", by="ops")
            await until(lambda: _applied(change.version, replica), "the archive")
            worker = process(queue, name, governance, history)
            async with working(worker):
                await until(lambda: _task_failed(replica, task), "the worker to refuse it")
                assert await _runs(client) == []  # out of service: no run to read
            change = await store.change(FLOW, None, "active", by="ops")
            await until(lambda: _applied(change.version, replica), "the activation")
            (ended,) = await _runs(client)
            assert (ended["run_id"], ended["status"], ended["error_type"], ended["steps"]) \
                == (queued["run_id"], "failed", "FlowUnavailable", [])
            assert ended["ended_at"] is not None
            assert (await task.status()).status_message == \
                f"flow {FLOW!r} version 1.0.0 is no longer published here; the task did not run"
        assert REFUNDED == []
    finally:
        await store.aclose()


async def _runs(client: Client) -> list[dict[str, Any]]:
    listed = await client.read_resource("chainweaver://runs")
    return json.loads(listed[0].text)["runs"]


async def _task_failed(server: FlowServer, task: ToolTask) -> bool:
    docket = running_docket(server.fastmcp)
    execution = (await _lookup_task(docket, None, task.task_id))[0]
    await execution.sync()
    return execution.state == ExecutionState.FAILED
