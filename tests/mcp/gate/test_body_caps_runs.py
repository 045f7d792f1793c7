"""The body cap on reads of a run's output (``SecurityConfig.max_body_bytes``): an
output above the cap read whole is refused -32602 naming the cap, and audited as a
refusal; a ranged read within the cap is served, on both protocol eras."""

from __future__ import annotations

import base64

import pytest
from fastmcp import Client
from mcp import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.body_cap import BODY_TOO_LARGE

MODES = ["auto", "legacy"]
CAP = 4096


class Size(BaseModel):
    n: int


@tool(safety=ToolSafetyContract("read"))
def loose(size: Size) -> dict:
    return {"data": "x" * size.n}


def server(events: list[AuditEvent]) -> FlowServer:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(loose)
    registry.register_flow(Flow("untyped", "Untyped output.", [FlowStep("loose")]))
    return FlowServer(executor,
                      security=SecurityConfig(audit_hook=events.append, max_body_bytes=CAP),
                      run_history=RunHistory(output_limit=1024))


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_run_output_above_the_cap_is_read_only_in_ranges(mode: str) -> None:
    events: list[AuditEvent] = []
    async with Client(server(events).fastmcp, mode=mode) as client:
        result = await client.call_tool("untyped", {"n": 20_000})
        output = result.meta["chainweaver"]["output"]
        assert output["size"] > CAP
        with pytest.raises(MCPError) as refused:
            await client.read_resource(output["uri"])
        ranged = (await client.read_resource(f"{output['uri']}?offset=0&length={CAP}"))[0]
    error = refused.value.error
    assert error.code == INVALID_PARAMS
    assert f"limit of {CAP} bytes" in error.message
    assert "read it in ranges" in error.message
    assert error.data == {"reason": BODY_TOO_LARGE, "limit": CAP, "size": output["size"]}
    assert "xxxx" not in error.message  # never the content
    assert len(base64.b64decode(ranged.blob)) == CAP  # a range reads as bytes
    reads = [e for e in events if e.kind == "resource" and e.name == output["uri"]]
    assert [(e.decision, e.reason) for e in reads if e.reason == BODY_TOO_LARGE] == [
        ("denied", BODY_TOO_LARGE)]
