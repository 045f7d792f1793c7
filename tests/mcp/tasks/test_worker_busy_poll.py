"""A task worker whose slots are all busy notices a freed one at once.

Docket's worker loop sleeps its whole check interval (50 ms under fastmcp-tasks)
whenever every slot is busy, so a slot that frees meanwhile stays idle: with short
tasks, a worker ran them at a fraction of its slots' pace. ChainWeaver's worker reads
a short interval while (and only while) every slot is busy; an idle worker polls Redis
no more often than before. Real fastmcp clients, the in-memory backend.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from fastmcp import Client
from fastmcp_tasks import call_tool_task

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import FlowServer, TaskSettings, fastmcp_seams

LIMIT = 10.0  # seconds: only stops a hang
CONFIGURED = 0.05  # fastmcp-tasks' default check interval
GATE: dict[str, asyncio.Event] = {}


@tool(safety=ToolSafetyContract(SideEffectLevel.READ))
async def held(n: int) -> dict[str, int]:
    """Waits until the test lets it finish."""
    GATE["started"].set()
    await GATE["release"].wait()
    return {"n": n}


def build(concurrency: int) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(held)
    executor.registry.register_flow(Flow("held_flow", "d", [FlowStep("held")]))
    return FlowServer(executor, tasks=TaskSettings(concurrency=concurrency))


def interval(flow_server: FlowServer) -> float:
    worker = getattr(flow_server.fastmcp, fastmcp_seams.WORKER)
    return float(worker.minimum_check_interval.total_seconds())


@pytest.mark.anyio
async def test_a_worker_polls_fast_only_while_every_slot_is_busy() -> None:
    GATE.update(started=asyncio.Event(), release=asyncio.Event())
    flow_server = build(concurrency=1)
    async with Client(flow_server.fastmcp) as client:
        assert interval(flow_server) == CONFIGURED  # idle: Docket's own pace
        task = await call_tool_task(client, "held_flow", {"n": 1})
        await asyncio.wait_for(GATE["started"].wait(), LIMIT)
        assert interval(flow_server) == fastmcp_seams.BUSY_POLL  # its one slot is busy
        GATE["release"].set()
        result = await asyncio.wait_for(task.result(), LIMIT)
        assert result.is_error is False
        # The worker frees its slot just after the result is stored: wait for it (bounded).
        for _ in range(int(LIMIT / 0.01)):
            if interval(flow_server) == CONFIGURED:
                break
            await asyncio.sleep(0.01)
        assert interval(flow_server) == CONFIGURED  # the slot is free again


@pytest.mark.anyio
async def test_an_enqueue_only_replica_never_polls_fast() -> None:
    flow_server = build(concurrency=0)  # no slots: always "full", never busy
    async with Client(flow_server.fastmcp):
        assert interval(flow_server) == CONFIGURED


@pytest.mark.anyio
async def test_a_moved_worker_name_leaves_dockets_pace_and_tasks_run(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    GATE.update(started=asyncio.Event(), release=asyncio.Event())
    GATE["release"].set()
    monkeypatch.setattr(fastmcp_seams, "WORKER_TASKS", "_moved_in_a_new_release")
    monkeypatch.setattr(fastmcp_seams, "_warned", set())
    flow_server = build(concurrency=1)
    with caplog.at_level(logging.WARNING, logger="chainweaver.mcp.fastmcp_seams"):
        async with Client(flow_server.fastmcp) as client:
            worker = getattr(flow_server.fastmcp, fastmcp_seams.WORKER)
            assert type(worker.minimum_check_interval) is timedelta  # untouched
            task = await call_tool_task(client, "held_flow", {"n": 2})
            result = await asyncio.wait_for(task.result(), LIMIT)
            assert result.is_error is False
    assert "notices a freed one only after its whole check interval" in caplog.text


@pytest.mark.anyio
async def test_a_running_steps_status_lands_in_dockets_progress_hash() -> None:
    # The status is written as plain commands, to the hash Docket keeps a task's
    # progress in (its layout, reached in fastmcp_seams): tasks/get shows it.
    from docket.execution import ExecutionProgress

    GATE.update(started=asyncio.Event(), release=asyncio.Event())
    flow_server = build(concurrency=1)
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "held_flow", {"n": 3})
        await asyncio.wait_for(GATE["started"].wait(), LIMIT)
        docket = fastmcp_seams.running_docket(flow_server.fastmcp)
        assert fastmcp_seams.progress_key(docket, "k") == \
            ExecutionProgress(docket, "k")._redis_key
        for _ in range(200):  # the status write follows the step's start
            status = await task.status()
            if status.status_message == "step 1/1 held":
                break
            await asyncio.sleep(0.01)
        assert (status.status, status.status_message) == ("working", "step 1/1 held")
        GATE["release"].set()
        result = await asyncio.wait_for(task.result(), LIMIT)
        assert result.is_error is False
