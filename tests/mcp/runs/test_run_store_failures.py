"""A run store that fails answers run reads with one fixed error, on both eras: -32603
and a message that never names the store's host, port or password (the Redis client's
own text did), while the server log gives operators the detail, password masked (in
the URL's user part or its ``?password=``). Runs go on meanwhile (their records are
lost, and logged): calls, calls that ask for approval and their retries, background
tasks and their cancellation."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest
from fastmcp import Client
from fastmcp_tasks import call_tool_task
from mcp import MCPError
from servers import task_tools
from support.catalogue import build_catalogue
from support.mcp_client import raw_call
from support.polling import until
from support.procs import free_port
from support.run_records import Text

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import AuditEvent, ExposurePolicy, FlowServer, SecurityConfig
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.runs.approval import APPROVAL_KEY
from chainweaver.mcp.runs.records import STORE_UNAVAILABLE

from ..tasks.test_tasks import LIMIT
from ..tasks.test_tasks import executor as task_executor

pytestmark = pytest.mark.tasks  # the Redis client
RUN = "0123456789abcdef01234567"
READS = ["chainweaver://runs", "chainweaver://runs?flow=order_status&limit=5",
         f"chainweaver://runs/{RUN}", f"chainweaver://runs/{RUN}/output?offset=0&length=9"]


def server(url: str, events: list[AuditEvent] | None = None) -> FlowServer:
    hooks = SecurityConfig(audit_hook=events.append) if events is not None else None
    return FlowServer(build_catalogue(), security=hooks,
                      run_history=RunHistory(store=url, output_limit=10))


async def refused(client: Client, uri: str) -> Any:
    with pytest.raises(MCPError) as caught:
        await client.read_resource(uri)
    return caught.value.error


def check_logged(caplog: pytest.LogCaptureFixture, port: int) -> None:
    lines = [r.getMessage() for r in caplog.records if r.name == "chainweaver.mcp.runs"]
    detailed = [line for line in lines if f"127.0.0.1:{port}" in line]
    assert detailed, lines  # operators learn where and why
    assert all("hunter2" not in line for line in lines)
    assert any(re.search(r"redis://cw:\*\*\*@127\.0\.0\.1:\d+/0: (get|page) failed: "
                         r"ConnectionError", line) for line in detailed), detailed


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_store_nobody_answers_is_one_fixed_error(
        mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "chainweaver.mcp.runs")
    port = free_port()  # closed: nothing listens there
    events: list[AuditEvent] = []
    async with Client(server(f"redis://cw:hunter2@127.0.0.1:{port}/0", events).fastmcp,
                      mode=mode) as client:
        for uri in READS:
            error = await refused(client, uri)
            assert (error.code, error.message) == (-32603, STORE_UNAVAILABLE), uri
            assert str(port) not in str(error.data) and "127.0.0.1" not in str(error.data)
        # A call is answered meanwhile (here a large output, whose link cannot be
        # kept), never with the store's address.
        result = await client.session.call_tool("order_status", {"order_id": "A-1001"})
        assert len(result.meta["chainweaver"]["run_id"]) == 24
        assert str(port) not in str(result.content) and "127.0.0.1" not in str(result)
        assert result.is_error and result.content[0].text.endswith(
            "this server cannot keep it for reading in ranges right now, try again later.")
        assert "output" not in result.meta["chainweaver"]
    check_logged(caplog, port)
    # Every read was audited like any other: decided, then completed with an error.
    for uri in READS:
        assert [(e.phase, e.outcome) for e in events if e.name == uri] == [
            ("decision", None), ("completed", "error")], uri


@pytest.mark.anyio
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_redis_that_stops_is_one_fixed_error(
        mode: str, caplog: pytest.LogCaptureFixture) -> None:
    from support.redis_server import redis_server

    caplog.set_level(logging.WARNING, "chainweaver.mcp.runs")
    with redis_server() as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        served = server(url)
        async with Client(served.fastmcp, mode=mode) as client:
            result = await client.session.call_tool("order_status", {"order_id": "A-1001"})
            run_id = result.meta["chainweaver"]["run_id"]
            await client.read_resource(f"chainweaver://runs/{run_id}")
            await client.read_resource(f"chainweaver://runs/{run_id}/output")
    # The Redis server is gone; the FlowServer and its store's connections remain.
    async with Client(served.fastmcp, mode=mode) as client:
        for uri in ("chainweaver://runs", f"chainweaver://runs/{run_id}",
                    f"chainweaver://runs/{run_id}/output"):
            error = await refused(client, uri)
            assert (error.code, error.message) == (-32603, STORE_UNAVAILABLE), uri
    lines = [r.getMessage() for r in caplog.records if r.name == "chainweaver.mcp.runs"]
    assert any(f"127.0.0.1:{port}" in line and "failed: ConnectionError" in line
               for line in lines), lines


def closed_store() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


@pytest.mark.anyio
async def test_a_password_in_the_query_is_masked_in_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "chainweaver.mcp.runs")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0?password=hunter2&socket_timeout=5"
    async with Client(server(url).fastmcp) as client:
        error = await refused(client, "chainweaver://runs")
    assert (error.code, error.message) == (-32603, STORE_UNAVAILABLE)
    lines = [r.getMessage() for r in caplog.records if r.name == "chainweaver.mcp.runs"]
    assert lines and all("hunter2" not in line for line in lines), lines
    assert any(f"127.0.0.1:{port}/0?password=***&socket_timeout=5: page failed" in line
               for line in lines), lines


@tool(safety=ToolSafetyContract("write", requires_approval=True, approval_reason="stamps"))
def stamp(data: Text) -> Text:
    return Text(text=f"stamped {data.text}")


async def never_asked(*args: Any) -> None:
    raise AssertionError("the 2026-07-28 server answers input_required instead")


@pytest.mark.anyio
async def test_a_call_that_asks_approval_goes_on_while_the_store_fails(
        caplog: pytest.LogCaptureFixture) -> None:
    # 2026-07-28 only: on 2025-11-25 the server asks inside the call (no retry).
    caplog.set_level(logging.WARNING, "chainweaver.mcp.runs")
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(stamp)
    executor.registry.register_flow(Flow("gamma", "Stamps.", [FlowStep("stamp")]))
    served = FlowServer(executor,
                        policy=ExposurePolicy(allowed_side_effects=["none", "read", "write"],
                                              approval="elicit"),
                        run_history=RunHistory(store=closed_store()))
    call = {"name": "gamma", "arguments": {"text": "x"}}
    async with Client(served.fastmcp, elicitation_handler=never_asked) as client:
        asked = await raw_call(client, call)
        assert asked["resultType"] == "input_required", asked
        reply = {APPROVAL_KEY: {"action": "accept", "content": {"approve": True}}}
        done = await raw_call(client, {**call, "inputResponses": reply,
                                       "requestState": asked["requestState"]})
    assert done["isError"] is False, done
    assert done["structuredContent"] == {"text": "stamped x"}
    lines = [r.getMessage() for r in caplog.records if r.name == "chainweaver.mcp.runs"]
    assert any("could not be read; this run is not recorded" in line for line in lines)


@pytest.mark.anyio
async def test_a_task_runs_and_is_cancelled_while_the_store_fails() -> None:
    task_tools.COUNTS.clear()
    task_tools.HOLD = None
    served = FlowServer(task_executor(), tasks="memory://",
                        run_history=RunHistory(store=closed_store()))
    try:
        async with Client(served.fastmcp) as client:
            task = await call_tool_task(client, "report", {"n": 1})
            result = await asyncio.wait_for(task.result(), LIMIT)
            assert not result.is_error and result.structured_content == {"n": 21}
            task_tools.HOLD = asyncio.Event()
            task = await call_tool_task(client, "report", {"n": 1})

            async def enriching() -> bool:
                return task_tools.COUNTS["enrich"] == 2

            await until(enriching, "the enrich step", LIMIT)
            await task.cancel()  # answered, though the run's record cannot be marked
            assert (await task.status()).status == "cancelled"
    finally:
        task_tools.HOLD = None


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_listing_a_flow_outside_the_view_reads_no_store(mode: str) -> None:
    """``chainweaver://runs?flow=F`` for a flow outside the caller's view (archived
    here, or a name that never existed) lists nothing without reading the store: it
    used to walk every run of the caller's the store holds for F (on Redis, a round
    trip per 64 of them) only to drop them all, and to fail when the store did."""
    flows = server(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    flows.executor.registry.set_lifecycle("product_search", "archived")
    async with Client(flows.fastmcp, mode=mode) as client:
        for flow in ("product_search", "never_existed"):
            listed = await client.read_resource(f"chainweaver://runs?flow={flow}&limit=5")
            assert json.loads(listed[0].text) == {"runs": [], "next_cursor": None}, flow
        error = await refused(client, "chainweaver://runs?flow=order_status")
        assert (error.code, error.message) == (-32603, STORE_UNAVAILABLE)  # in view
