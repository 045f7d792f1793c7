"""A run store that fails answers run reads with one fixed error, on both eras: -32603
and a message that never names the store's host, port or password (the Redis client's
own text did), while the server log gives operators the detail, password masked. Calls
go on meanwhile (their records are lost, and logged)."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue
from support.procs import free_port

from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig, ServingConfig
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.runs.records import STORE_UNAVAILABLE

pytestmark = pytest.mark.tasks  # the Redis client
RUN = "0123456789abcdef01234567"
READS = ["chainweaver://runs", "chainweaver://runs?flow=order_status&limit=5",
         f"chainweaver://runs/{RUN}", f"chainweaver://runs/{RUN}/output?offset=0&length=9"]


def server(url: str, events: list[AuditEvent] | None = None) -> FlowServer:
    hooks = SecurityConfig(audit_hook=events.append) if events is not None else None
    return FlowServer(build_catalogue(), security=hooks, serving=ServingConfig(
        run_history=RunHistory(store=url, output_limit=10)))


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
