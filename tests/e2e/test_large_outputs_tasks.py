"""A background task's output too large to send in one message (issue 32, item 8): a link
its caller reads back when a reader can reach where it is kept (a memory task backend:
this process; a run history on Redis: every process), and otherwise an ``isError``
result naming the limit, never a link to another process's memory. Real Redis (the
``redis_url`` fixture), a real in-memory client at 2026-07-28 (tasks need it)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json

import pytest
import redis
from fastmcp import Client
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer, TaskSettings
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.body_cap import MAX_RANGE_BYTES, MESSAGE_BUDGET

pytestmark = [pytest.mark.anyio, pytest.mark.tasks]
LIMIT = 60.0  # seconds: only to stop a hang
SIZE = 2_000_000


class Size(BaseModel):
    n: int


@tool(safety=ToolSafetyContract("read"))
def loose(size: Size) -> dict:
    return {"data": "x" * size.n}


def server(tasks: str, history: RunHistory | None = None) -> FlowServer:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(loose)
    registry.register_flow(Flow("untyped", "Untyped output.", [FlowStep("loose")]))
    return FlowServer(executor, tasks=TaskSettings(url=tasks, mode="optional"),
                      run_history=history)


@pytest.fixture
def queue(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(url).flushdb()
    return url


async def task_result(flows: FlowServer) -> tuple[Client, object]:
    from fastmcp_tasks import call_tool_task

    client = Client(flows.fastmcp)
    await client.__aenter__()
    task = await call_tool_task(client, "untyped", {"n": SIZE}, raise_on_error=False)
    return client, await asyncio.wait_for(task.result(), LIMIT)


async def read_back(client: Client, uri: str, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = await client.read_resource(f"{uri}?offset={len(data)}&length={MAX_RANGE_BYTES}")
        data += base64.b64decode(part[0].blob)
    return data


@pytest.mark.parametrize("where", ["memory tasks", "history on redis"])
async def test_a_tasks_large_output_is_a_link_where_every_reader_reaches_it(
        where: str, queue: str) -> None:
    flows = server("memory://") if where == "memory tasks" else \
        server(queue, RunHistory(store=queue, prefix="cw-test-large"))
    client, result = await task_result(flows)
    try:
        output = result.meta["chainweaver"]["output"]  # type: ignore[attr-defined]
        assert result.content[1].type == "resource_link"  # type: ignore[attr-defined]
        data = await read_back(client, output["uri"], output["size"])
    finally:
        await client.__aexit__(None, None, None)
    assert json.loads(data) == {"data": "x" * SIZE}
    assert hashlib.sha256(data).hexdigest() == output["sha256"]


async def test_without_a_shared_history_a_redis_tasks_large_output_is_an_error(
        queue: str) -> None:
    # Its worker's memory is no place a replica could read from.
    flows = server(queue, history=None)
    client, result = await task_result(flows)
    await client.__aexit__(None, None, None)
    assert result.is_error and len(result.content) == 1  # type: ignore[attr-defined]
    assert result.content[0].text == (  # type: ignore[attr-defined]
        f"The result of flow 'untyped' is {SIZE + 12} bytes, above the {MESSAGE_BUDGET} "
        "bytes one MCP message carries to a standard client; a background task's output "
        "that large is kept for reading in ranges only with a run history every server "
        "process shares (run_history on Redis).")
    assert "output" not in result.meta["chainweaver"]  # type: ignore[attr-defined]
