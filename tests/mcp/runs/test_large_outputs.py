"""Large outputs as resource links, through a real in-memory client on both eras: a
10 MB output yields a result under 4 KB whose link reads back (whole or in ranges) to
bytes with the audited SHA-256; a flow with an output schema gets an isError result
carrying the link, never a result contradicting its schema."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.body_cap import MAX_RANGE_BYTES, MESSAGE_BUDGET

MODES = ["auto", "legacy"]


class Size(BaseModel):
    n: int


class Blob(BaseModel):
    data: str


@tool(safety=ToolSafetyContract("read"))
def big(size: Size) -> Blob:
    return Blob(data="é" * (size.n // 2))  # two bytes a character in UTF-8


@tool(safety=ToolSafetyContract("read"))
def loose(size: Size) -> dict:
    return {"data": "x" * size.n}


def server(events: list[AuditEvent], limit: int = 65_536) -> FlowServer:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(big)
    executor.register_tool(loose)
    registry.register_flow(Flow("typed", "Typed output.", [FlowStep("big")],
                                output_schema=Blob))
    registry.register_flow(Flow("untyped", "Untyped output.", [FlowStep("loose")]))
    return FlowServer(executor, security=SecurityConfig(audit_hook=events.append),
                      run_history=RunHistory(output_limit=limit))


def completed(events: list[AuditEvent]) -> AuditEvent:
    return [e for e in events if e.kind == "tool" and e.phase == "completed"][-1]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_10_mb_output_is_a_small_result_and_a_link_with_the_audited_digest(
        mode: str) -> None:
    events: list[AuditEvent] = []
    async with Client(server(events).fastmcp, mode=mode) as client:
        result = await client.session.call_tool("untyped", {"n": 10_000_000})
        assert not result.is_error
        assert len(result.model_dump_json(by_alias=True).encode()) < 4096
        link = result.content[1]
        assert link.type == "resource_link" and link.mime_type == "application/json"
        output = result.meta["chainweaver"]["output"]
        assert str(link.uri) == output["uri"] and link.size == output["size"] > 10_000_000
        audited = completed(events)
        assert (audited.result_sha256, audited.result_length, audited.outcome) == (
            output["sha256"], output["size"], "ok")
        # Whole, it could not reach a client in one message: refused, naming the ranges.
        with pytest.raises(MCPError) as caught:
            await client.read_resource(output["uri"])
        assert caught.value.error.code == -32602
        assert f"of at most {MAX_RANGE_BYTES} bytes" in caught.value.error.message
        assert caught.value.error.data == {"reason": "body_too_large",
                                           "limit": MESSAGE_BUDGET, "size": link.size}
        digest, offset, step = hashlib.sha256(), 0, MAX_RANGE_BYTES
        while offset < link.size:
            part = (await client.read_resource(
                f"{output['uri']}?offset={offset}&length={step}"))[0]
            digest.update(base64.b64decode(part.blob))
            offset += step
        assert digest.hexdigest() == audited.result_sha256
        record = json.loads((await client.read_resource(
            f"chainweaver://runs/{result.meta['chainweaver']['run_id']}"))[0].text)
        assert (record["output_sha256"], record["output_size"]) == (
            audited.result_sha256, link.size)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_flow_with_an_output_schema_gets_an_error_result_with_the_link(
        mode: str) -> None:
    events: list[AuditEvent] = []
    async with Client(server(events, limit=1000).fastmcp, mode=mode) as client:
        small = await client.session.call_tool("typed", {"n": 100})
        assert not small.is_error and small.structured_content == {"data": "é" * 50}
        result = await client.session.call_tool("typed", {"n": 5000})
        assert result.is_error and result.structured_content is None
        assert "above this server's limit of 1000 bytes" in result.content[0].text
        uri = result.meta["chainweaver"]["output"]["uri"]
        data = (await client.read_resource(uri))[0].text
        assert json.loads(data) == {"data": "é" * 2500}
        audited = completed(events)
        assert audited.outcome == "ok" and audited.error_type is None
        assert audited.result_sha256 == hashlib.sha256(data.encode()).hexdigest()
        record = json.loads((await client.read_resource(
            f"chainweaver://runs/{result.meta['chainweaver']['run_id']}"))[0].text)
        assert record["status"] == "completed"


@pytest.mark.anyio
@pytest.mark.parametrize("query", ["offset=-1", "length=0", "offset=x", "length=1&length=2",
                                   "start=1"])
async def test_a_bad_range_is_invalid_params_whoever_asks(query: str) -> None:
    async with Client(server([], limit=1000).fastmcp) as client:
        result = await client.session.call_tool("untyped", {"n": 5000})
        for uri in (result.meta["chainweaver"]["output"]["uri"],
                    "chainweaver://runs/" + "0" * 24 + "/output"):
            with pytest.raises(MCPError) as caught:
                await client.read_resource(f"{uri}?{query}")
            assert caught.value.error.code == -32602
            asked = f"{uri}?{query}"
            assert caught.value.error.message.startswith(f"Invalid run resource URI {asked!r}")
