"""Approval inside a background task under attack, on Redis: two in-process replicas
that only enqueue and one in-process worker share a queue (a private Redis). A waiting
task cancelled on the other replica never runs and is audited there; the same answer
sent through both replicas at once runs the flow once."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import pytest
import redis
from fastmcp_tasks import ToolTask, call_tool_task
from support.task_asks import answering, send_task_update

from chainweaver import FlowExecutor, FlowRegistry
from chainweaver.files import find_flow_files, load_flows
from chainweaver.mcp import AuditEvent, ExposurePolicy, FlowServer, SecurityConfig, TaskSettings

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
SERVERS = Path(__file__).resolve().parents[1] / "servers"
LIMIT = 30.0  # seconds: only to stop a hang


@pytest.fixture
def queue(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    url = redis_url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(url).flushdb()
    monkeypatch.setenv("CW_TASK_REDIS", url)  # the refund tool counts its runs there
    return url


def replica(queue: str, concurrency: int | None, audit: list[AuditEvent]) -> FlowServer:
    sys.path.insert(0, str(SERVERS))
    import task_tools

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(task_tools.refund)
    for flow in load_flows(find_flow_files([SERVERS / "task_flows" / "refund.flow.yaml"]),
                           tools=executor.tools):
        executor.registry.register_flow(dataclasses.replace(flow, version="1.0.0"))
    return FlowServer(executor,
                      tasks=TaskSettings(url=queue, concurrency=concurrency, name="cw-attack"),
                      policy=ExposurePolicy(allowed_side_effects=["read", "write"],
                                            approval="elicit"),
                      security=SecurityConfig(audit_hook=audit.append))


def refunds(queue: str, order: str) -> int:
    return int(redis.Redis.from_url(queue).get(f"cw-test:refund:{order}") or 0)








def trail(audit: list[AuditEvent], task_id: str) -> list[tuple[str, str | None]]:
    return [(e.phase, e.task_status) for e in audit
            if e.task_id == task_id and e.kind == "task" and e.task_status]


async def test_a_waiting_task_cancelled_on_the_other_replica_is_audited_and_never_runs(
        queue: str) -> None:
    on_a, on_b, on_w = [], [], []  # type: ignore[var-annotated]
    a, b = replica(queue, 0, on_a), replica(queue, 0, on_b)
    worker = asyncio.create_task(replica(queue, None, on_w).run_worker_async())
    try:
        async with answering(a) as ca, answering(b) as cb:
            task = await call_tool_task(ca, "refund_order", {"order": "X-1"})
            theirs = ToolTask(cb, "refund_order", task.create_result)
            asked = await theirs.wait(state="input_required", timeout=LIMIT)
            assert asked.input_requests
            await theirs.cancel()
            await send_task_update(ca, task.task_id, {key: {"action": "accept",
                                                  "content": {"approve": True}}
                                            for key in asked.input_requests})
            await asyncio.sleep(1.0)
            status = (await task.status()).status
    finally:
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker
    assert status == "cancelled" and refunds(queue, "X-1") == 0
    assert ("state", "cancelled") in trail(on_b, task.task_id), on_b
    assert ("state", "input_required") in trail(on_w, task.task_id)
    assert not [e for e in on_a + on_b + on_w if e.phase == "approval"]


async def test_an_answer_through_the_other_replica_runs_once_on_the_worker(
        queue: str) -> None:
    on_a, on_b, on_w = [], [], []  # type: ignore[var-annotated]
    a, b = replica(queue, 0, on_a), replica(queue, 0, on_b)
    worker = asyncio.create_task(replica(queue, None, on_w).run_worker_async())
    try:
        async with answering(a) as ca, answering(b) as cb:
            task = await call_tool_task(ca, "refund_order", {"order": "X-2"})
            asked = await task.wait(state="input_required", timeout=LIMIT)
            answer = {key: {"action": "accept", "content": {"approve": True}}
                      for key in asked.input_requests}
            # The same answer through both replicas at once: one next leg.
            await asyncio.gather(send_task_update(ca, task.task_id, answer),
                                 send_task_update(cb, task.task_id, answer))
            done = await task.wait(timeout=LIMIT)
            await asyncio.sleep(0.5)
    finally:
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker
    assert done.status == "completed" and refunds(queue, "X-2") == 1
    assert [e.reason for e in on_w if e.phase == "approval"] == ["accept"]
