"""``ServingConfig(max_body_bytes=...)``: a prompt or resource read above the cap gets
-32602 naming the cap on both eras, audited as a refusal; the default serves a large
catalogue's index."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from mcp_types import INVALID_PARAMS
from support.catalogue import build_catalogue

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.errors import ExposureConfigError
from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig, ServingConfig
from chainweaver.mcp.config import DEFAULT_MAX_BODY_BYTES
from chainweaver.mcp.gate.body_cap import MESSAGE_BUDGET

MODES = ["auto", "legacy"]


def served(limit: int | None, events: list[AuditEvent] | None = None) -> FlowServer:
    security = SecurityConfig(audit_hook=events.append) if events is not None else None
    return FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                      security=security, serving=ServingConfig(max_body_bytes=limit))


async def _refusal(request: Any) -> Any:
    with pytest.raises(MCPError) as raised:
        await request()
    return raised.value.error


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("audited", [True, False], ids=["hooks", "no-hooks"])
async def test_bodies_above_the_cap_are_invalid_params_naming_the_cap(
        mode: str, audited: bool) -> None:
    events: list[AuditEvent] = []
    server = served(300, events if audited else None)
    async with Client(server.fastmcp, mode=mode) as client:
        requests = {
            "chainweaver://flows": lambda: client.read_resource("chainweaver://flows"),
            "chainweaver://flows/product_search/schema": lambda: client.read_resource(
                "chainweaver://flows/product_search/schema"),
            "chainweaver_guide": lambda: client.get_prompt("chainweaver_guide"),
            "product_search": lambda: client.get_prompt("product_search", {"query": "q"}),
        }
        for name, request in requests.items():
            error = await _refusal(request)
            assert error.code == INVALID_PARAMS
            assert f"{name!r}" in error.message and "limit of 300 bytes" in error.message
            assert error.data["reason"] == "body_too_large" and error.data["limit"] == 300
        # Tools are not bodies under this cap.
        assert not (await client.call_tool("product_search", {"query": "q"})).is_error
    if audited:
        refused = [e for e in events if e.reason == "body_too_large"]
        assert [(e.kind, e.decision, e.outcome, e.error_type) for e in refused] == \
            [("resource", "denied", "error", "BodyTooLarge")] * 2 + \
            [("prompt", "denied", "error", "BodyTooLarge")] * 2
        assert all(e.result_sha256 is None for e in refused)


@pytest.mark.anyio
async def test_within_the_cap_and_without_one_everything_is_served() -> None:
    for limit in (None, DEFAULT_MAX_BODY_BYTES):
        async with Client(served(limit).fastmcp) as client:
            assert (await client.read_resource("chainweaver://flows"))[0].text
            assert (await client.get_prompt("chainweaver_guide")).messages


@tool(safety=ToolSafetyContract("read"))
def echo(text: str) -> dict[str, str]:
    return {"text": text}


def catalogue(count: int) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    for index in range(count):
        executor.registry.register_flow(Flow(
            f"flow_{index:05d}", f"Flow {index}: echoes its text back, for the index "
            "size check of a realistic catalogue with descriptions.", [FlowStep("echo")]))
    return FlowServer(executor, expose_schemas=True, expose_prompts=True)


@pytest.mark.slow
@pytest.mark.anyio
async def test_an_index_and_guide_too_large_to_send_are_refused_naming_the_paged_lists(
) -> None:
    # 1,000 flows fit one message; 8,000 (an index of about 3 MiB, a guide of about
    # 1.6 MiB) no standard client could receive in one: each is a clear -32602 that says
    # where the flows are listed.
    async with Client(catalogue(1_000).fastmcp) as client:
        index = (await client.read_resource("chainweaver://flows"))[0].text
        guide = (await client.get_prompt("chainweaver_guide")).messages[0].content.text
    assert len(json.loads(index)["flows"]) == 1_000 and guide.count("\n- `") == 1_000
    async with Client(catalogue(8_000).fastmcp) as client:
        with pytest.raises(MCPError) as read:
            await client.read_resource("chainweaver://flows")
        with pytest.raises(MCPError) as rendered:
            await client.get_prompt("chainweaver_guide")
        assert len(await client.list_tools()) == 8_000
    for caught, paged in ((read, "resources/list"), (rendered, "tools/list")):
        assert caught.value.error.code == -32602
        assert f"above the {MESSAGE_BUDGET} bytes one MCP message carries" in \
            caught.value.error.message
        assert f"{paged} lists the flows in pages" in caught.value.error.message
        assert caught.value.error.data["reason"] == "body_too_large"
        assert caught.value.error.data["size"] > MESSAGE_BUDGET


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10"])
def test_a_bad_cap_fails_when_the_config_is_built(value: object) -> None:
    with pytest.raises(ExposureConfigError, match="max_body_bytes"):
        ServingConfig(max_body_bytes=value)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_tools_only_list_too_large_to_send_is_an_error_naming_the_limit(
        mode: str) -> None:
    # resources_as_tools lists every resource in one tool result, unpaged: 4,000 flows
    # take about 2 MB. The result says so, naming the paged protocol list.
    server = catalogue(4_000)
    tools_only = FlowServer(server.executor, expose_schemas=True,
                            serving=ServingConfig(resources_as_tools=True))
    async with Client(tools_only.fastmcp, mode=mode) as client:
        result = await client.session.call_tool("list_resources", {})
    assert result.is_error and len(result.content[0].text) < 1024
    assert result.content[0].text.startswith("The tool result 'list_resources' would take ")
    assert result.content[0].text.endswith(
        f"above the {MESSAGE_BUDGET} bytes one MCP message carries to a standard client; "
        "resources/list lists them in pages")
