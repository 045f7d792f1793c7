"""A task store that closes under a running task (its worker shutting down, Redis
gone) stops the run without recording a failure of the flow (issue 36, item 6): the
run stays unfinished, to resume from its checkpoints on redelivery. Real Redis, a
private one this test shuts down."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
import redis
from fastmcp import Client
from pydantic import BaseModel
from support.redis_server import redis_server

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer, RunHistory, ServingConfig, TaskSettings
from chainweaver.mcp.runs.records import RunQuery

pytestmark = pytest.mark.tasks
READ = ToolSafetyContract("read", idempotent=True)
LIMIT = 30.0  # seconds: only to stop a hang


class Count(BaseModel):
    n: int


running = threading.Event()


@tool(safety=READ)
def begin(n: int) -> Count:
    """First step."""
    return Count(n=n + 1)


@tool(safety=READ)
def wait(n: int) -> Count:
    """Runs while the test shuts the store down."""
    running.set()
    time.sleep(1.0)
    return Count(n=n + 1)


@tool(safety=READ)
def finish(n: int) -> Count:
    """Last step."""
    return Count(n=n)


@pytest.mark.anyio
async def test_a_task_store_closing_under_a_run_does_not_fail_the_flow(
        caplog: pytest.LogCaptureFixture) -> None:
    from fastmcp_tasks import call_tool_task

    executor = FlowExecutor(FlowRegistry())
    for step_tool in (begin, wait, finish):
        executor.register_tool(step_tool)
    executor.registry.register_flow(Flow("closing", "Three steps.", [
        FlowStep("begin"), FlowStep("wait"), FlowStep("finish")]))
    running.clear()
    caplog.set_level(logging.INFO, logger="chainweaver")
    with redis_server() as url:
        server = FlowServer(executor, tasks=TaskSettings(url=url),
                            serving=ServingConfig(run_history=RunHistory()))
        async with Client(server.fastmcp) as client:
            await call_tool_task(client, "closing", {"n": 1})
            deadline = time.monotonic() + LIMIT
            while not running.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert running.is_set()
            redis.Redis.from_url(url).shutdown(nosave=True)  # under the running step
            stopped = "the task store failed under it"
            while time.monotonic() < deadline and not any(
                    stopped in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.05)
            store = server.run_store
            assert store is not None
            records, _ = await store.page(RunQuery())
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("chainweaver")]
    assert any(stopped in line and "ConnectionError" in line for line in lines), lines
    assert not any("failed at step" in line or "failed unexpectedly" in line
                   for line in lines), lines
    [record] = records
    assert record.flow == "closing"
    assert record.status not in ("failed", "completed")  # unfinished: it resumes
    assert record.error_type is None
