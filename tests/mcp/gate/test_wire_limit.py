"""No result is larger than a standard client can receive in one message, with or
without a run history, through a real in-memory client on both eras: an output too large
to send travels as a link its caller alone reads in ranges, a body too large to send is
a -32602 naming the limit, and what nowhere can keep is an isError result naming it."""

from __future__ import annotations

import base64
import hashlib
import json
import logging

import pytest
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.flows import FlowLifecycle
from chainweaver.mcp import (
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
)
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.body_cap import MAX_RANGE_BYTES, MESSAGE_BUDGET, WIRE_LIMIT
from chainweaver.mcp.hooks import bounded_text

MODES = ["auto", "legacy"]


class Size(BaseModel):
    n: int
    ch: str = "x"


class Blob(BaseModel):
    data: str


@tool(safety=ToolSafetyContract("read"))
def loose(size: Size) -> dict:
    return {"data": size.ch * size.n}


@tool(safety=ToolSafetyContract("read"))
def typed(size: Size) -> Blob:
    return Blob(data=size.ch * size.n)


@tool(safety=ToolSafetyContract("read"))
def shouts(size: Size) -> dict:
    raise ValueError(size.ch * size.n)


class Who:
    """The caller of the next requests, as the authenticator says."""

    def __init__(self) -> None:
        self.id = "alice"

    def __call__(self, gate: GateContext) -> CallerIdentity:
        return CallerIdentity(self.id, subject=self.id)


class Limiter:
    def __init__(self) -> None:
        self.names: list[str] = []

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        self.names.append(name)
        return True


def server(events: list[AuditEvent] | None = None, history: RunHistory | None = None,
           **security: object) -> FlowServer:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for function in (loose, typed, shouts):
        executor.register_tool(function)
    registry.register_flow(Flow("untyped", "Untyped output.", [FlowStep("loose")]))
    registry.register_flow(Flow("schema", "Typed output.", [FlowStep("typed")],
                                output_schema=Blob))
    registry.register_flow(Flow("failing", "Fails loudly.", [FlowStep("shouts")]))
    hooks = {"audit_hook": events.append} if events is not None else {}
    return FlowServer(executor, security=SecurityConfig(**hooks, **security), run_history=history)


def sent(result: object) -> int:
    """The bytes a result takes as the SDK sends it."""
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())  # type: ignore[attr-defined]


async def read_in_ranges(client: Client, uri: str, size: int) -> bytes:
    data, offset = b"", 0
    while offset < size:
        part = (await client.read_resource(f"{uri}?offset={offset}&length={MAX_RANGE_BYTES}"))
        chunk = base64.b64decode(part[0].blob)
        assert 0 < len(chunk) <= MAX_RANGE_BYTES
        data += chunk
        offset += len(chunk)
    return data


def test_the_limits_fit_a_standard_clients_message() -> None:
    assert WIRE_LIMIT == 1024 * 1024  # the MCP SDK client's largest server-sent event
    assert MESSAGE_BUDGET < WIRE_LIMIT
    # A range travels as base64: 4/3 of its bytes, with room for the envelope.
    assert 4 * ((MAX_RANGE_BYTES + 2) // 3) < MESSAGE_BUDGET
    assert RunHistory().output_limit * 6 < MESSAGE_BUDGET


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_without_a_history_an_output_too_large_to_send_is_a_link_only_its_caller_reads(
        mode: str) -> None:
    events: list[AuditEvent] = []
    who = Who()
    flows = server(events, authenticator=who)
    async with Client(flows.fastmcp, mode=mode) as client:
        small = await client.session.call_tool("untyped", {"n": 1000})
        assert not small.is_error and len(small.content) == 1
        result = await client.session.call_tool("untyped", {"n": 2_000_000})
        assert not result.is_error and sent(result) < 4096
        assert "would take" in result.content[0].text
        link = result.content[1]
        output = result.meta["chainweaver"]["output"]
        assert link.type == "resource_link" and str(link.uri) == output["uri"]
        audited = [e for e in events if e.kind == "tool" and e.phase == "completed"][-1]
        assert (audited.result_sha256, audited.result_length) == (output["sha256"],
                                                                  output["size"])
        # Whole, no client could receive it: refused, naming the ranges to read it in.
        with pytest.raises(MCPError) as whole:
            await client.read_resource(output["uri"])
        assert whole.value.error.code == -32602
        assert f"ranges (?offset=N&length=M) of at most {MAX_RANGE_BYTES} bytes" in \
            whole.value.error.message
        data = await read_in_ranges(client, output["uri"], output["size"])
        assert hashlib.sha256(data).hexdigest() == audited.result_sha256
        assert json.loads(data) == {"data": "x" * 2_000_000}
        # No history: the listing, the records and a small call's output are not there.
        run_id = result.meta["chainweaver"]["run_id"]
        small_id = small.meta["chainweaver"]["run_id"]
        for uri in ("chainweaver://runs", f"chainweaver://runs/{run_id}",
                    f"chainweaver://runs/{small_id}/output?offset=0"):
            with pytest.raises(MCPError) as missing:
                await client.read_resource(uri)
            assert missing.value.error.message == f"Resource not found: {uri!r}"
        templates = {t.uri_template for t in await client.list_resource_templates()}
        assert not any(t.startswith("chainweaver://runs") for t in templates)
        # Another caller: exactly like a run that never existed.
        who.id = "mallory"
        uri = f"{output['uri']}?offset=0"
        with pytest.raises(MCPError) as other:
            await client.read_resource(uri)
        assert other.value.error.message == f"Resource not found: {uri!r}"
        # Its flow leaves the caller's view: gone for its caller too.
        who.id = "alice"
        assert (await client.read_resource(uri))[0].blob
        flows.executor.registry.set_lifecycle("untyped", FlowLifecycle.ARCHIVED)
        with pytest.raises(MCPError) as gone:
            await client.read_resource(uri)
        assert gone.value.error.message == f"Resource not found: {uri!r}"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("history", [None, RunHistory()], ids=["spill", "history"])
async def test_escaping_and_a_schema_count_in_the_size_as_sent(
        mode: str, history: RunHistory | None) -> None:
    limit = history.output_limit if history is not None else None
    async with Client(server(history=history).fastmcp, mode=mode) as client:
        for flow, n, ch, linked in [
                ("untyped", 900_000, "x", limit is not None),  # fits as sent
                ("untyped", 900_000, '"', True),  # escaped: 1.8 MB as sent
                ("untyped", 170_000, "\0", True),  # escaped six times, then again
                ("schema", 600_000, "x", True),  # sent twice: text and structured
                ("schema", 400, '"', False)]:
            result = await client.session.call_tool(flow, {"n": n, "ch": ch})
            assert sent(result) < WIRE_LIMIT
            got = any(block.type == "resource_link" for block in result.content)
            assert got == linked, (flow, n, ch)
            if not linked:
                assert not result.is_error
                assert json.loads(result.content[0].text) == {"data": ch * n}


@pytest.mark.anyio
async def test_an_output_no_store_can_keep_is_an_error_naming_the_limit() -> None:
    history = RunHistory(output_limit=1000, max_output_bytes=5000)
    async with Client(server(history=history).fastmcp) as client:
        kept = await client.session.call_tool("untyped", {"n": 4000})
        assert kept.content[1].type == "resource_link"
        result = await client.session.call_tool("untyped", {"n": 9000})
        run = json.loads((await client.read_resource(
            f"chainweaver://runs/{result.meta['chainweaver']['run_id']}"))[0].text)
    # The flow ran to its end; what it made could not be delivered.
    assert (run["status"], run["error_type"]) == ("failed", "OutputTooLarge")
    assert result.is_error and len(result.content) == 1
    assert result.content[0].text == (
        f"The result of flow 'untyped' is 9012 bytes, above the {MESSAGE_BUDGET} bytes one "
        "MCP message carries to a standard client; this server cannot keep it for reading "
        "in ranges.")


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_an_error_message_too_large_to_send_is_replaced_by_one_naming_the_limit(
        mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "chainweaver.mcp.runs")
    async with Client(server().fastmcp, mode=mode) as client:
        result = await client.session.call_tool("failing", {"n": 3_000_000})
        assert result.is_error and sent(result) < 4096
        assert result.content[0].text.startswith("The result of flow 'failing' is ")
        assert f"above the {MESSAGE_BUDGET} bytes one MCP message carries" in \
            result.content[0].text
        still = await client.session.call_tool("failing", {"n": 10})
        assert still.is_error and "x" * 10 in still.content[0].text
    assert any("too large to send" not in r.getMessage() and "replaced by an error" in
               r.getMessage() for r in caplog.records)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("query", ["offset=" + "9" * 5000, "length=" + "1" * 5000,
                                   f"length={MAX_RANGE_BYTES + 1}"])
async def test_range_numbers_out_of_bounds_are_invalid_params_that_pass_the_gate(
        mode: str, query: str) -> None:
    events: list[AuditEvent] = []
    limiter = Limiter()
    flows = server(events, history=RunHistory(output_limit=1000), rate_limiter=limiter)
    async with Client(flows.fastmcp, mode=mode) as client:
        result = await client.session.call_tool("untyped", {"n": 5000})
        uri = f"{result.meta['chainweaver']['output']['uri']}?{query}"
        with pytest.raises(MCPError) as caught:
            await client.read_resource(uri)
        assert (await client.read_resource(uri.split("?")[0]))[0].text  # still serving
    assert caught.value.error.code == -32602
    name = query.split("=")[0]
    high = 2**53 if name == "offset" else MAX_RANGE_BYTES
    assert caught.value.error.message == (f"Invalid run resource URI {uri!r}: {name} must "
                                          f"be a whole number from {0 if name == 'offset' else 1} "
                                          f"to {high}")
    assert limiter.names.count("chainweaver://runs") == 2
    # The audit names the URI as read, bounded in length (see test_audit_bounds).
    reads = [(e.phase, e.outcome) for e in events
             if e.kind == "resource" and e.name == bounded_text(uri)]
    assert reads == [("decision", None), ("completed", "error")]
