"""A caller's mistake is answered, not logged as a server fault: a malformed run URI, an
unknown or hidden name through the tool forms (``resources_as_tools`` /
``prompts_as_tools``), a prompt argument that does not fit and a gate refusal inside a
tool form leave no traceback in the log, even at DEBUG; a real fault still does. Through
a real in-memory client, on both eras."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue

from chainweaver import Flow, FlowStep
from chainweaver.mcp import FlowServer, GateContext, SecurityConfig, ServingConfig
from chainweaver.mcp.config import RunHistory

MODES = ["auto", "legacy"]
SCHEMA = "chainweaver://flows/{}/schema"
MALFORMED_RUN_URIS = ["chainweaver://runs?limit=0", "chainweaver://runs?status=done",
                      "chainweaver://runs?cursor=x", "chainweaver://runs?colour=red",
                      "chainweaver://runs/" + "0" * 24 + "/output?offset=-1"]


def serving(**security: Any) -> FlowServer:
    return FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(**security),
                      serving=ServingConfig(resources_as_tools=True, prompts_as_tools=True),
                      run_history=RunHistory())


async def warmed(client: Client, logs: pytest.LogCaptureFixture) -> None:
    """Build the first snapshot (which logs why flows are excluded), then forget it."""
    await client.list_tools()
    await client.list_prompts()
    await client.list_resources()
    logs.clear()


def noisy(logs: pytest.LogCaptureFixture) -> list[str]:
    """Records that carry a traceback, span lines or are a warning or worse."""
    found = []
    for record in logs.records:
        text = logging.Formatter().format(record)
        if record.exc_info or len(text.splitlines()) > 1 or record.levelno >= logging.WARNING:
            found.append(f"{record.levelname} {record.name}: {text[:300]}")
    return found


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_malformed_run_uri_is_answered_without_a_traceback(
        mode: str, all_logs: pytest.LogCaptureFixture) -> None:
    async with Client(serving().fastmcp, mode=mode) as client:
        await warmed(client, all_logs)
        for uri in MALFORMED_RUN_URIS:
            with pytest.raises(MCPError) as caught:
                await client.read_resource(uri)
            assert caught.value.error.code == -32602
            assert caught.value.error.message.startswith(f"Invalid run resource URI {uri!r}: ")
    assert all_logs.records  # captured at DEBUG: the requests themselves are logged
    assert noisy(all_logs) == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_the_tool_forms_answer_unknown_names_without_a_traceback(
        mode: str, all_logs: pytest.LogCaptureFixture) -> None:
    asks = [
        ("read_resource", {"uri": SCHEMA.format("never_existed")},
         f"Unknown resource: {SCHEMA.format('never_existed')!r}"),
        ("read_resource", {"uri": SCHEMA.format("draft_report")},  # excluded: hidden
         f"Unknown resource: {SCHEMA.format('draft_report')!r}"),
        ("read_resource", {"uri": MALFORMED_RUN_URIS[0]},
         f"Invalid run resource URI {MALFORMED_RUN_URIS[0]!r}: limit must be a whole number "
         "from 1 to 200"),
        ("get_prompt", {"name": "never_existed"}, "Unknown prompt: 'never_existed'"),
        ("get_prompt", {"name": "draft_report__secret"}, "Unknown prompt: "
         "'draft_report__secret'"),
        ("get_prompt", {"name": "product_search", "arguments": {"query": "q", "limit": "x"}},
         "Prompt 'product_search': argument 'limit' must be an integer"),
        ("get_prompt", {"name": "product_search", "arguments": {"query": "q", "limit": 5}},
         "Prompt 'product_search': argument 'limit' must be a string, got number"),
        ("get_prompt", {"name": "product_search", "arguments": {}},
         "Prompt 'product_search': missing required argument 'query'"),
    ]
    async with Client(serving().fastmcp, mode=mode) as client:
        await warmed(client, all_logs)
        for tool, arguments, text in asks:
            result = await client.call_tool(tool, arguments, raise_on_error=False)
            assert result.is_error, (tool, arguments)
            assert result.content[0].text == text
        # What succeeds still does.
        read = await client.call_tool("read_resource", {"uri": SCHEMA.format("order_status")})
        assert '"order_status"' in read.content[0].text
    assert noisy(all_logs) == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_caller_mistake_is_not_masked_by_error_detail(
        mode: str, all_logs: pytest.LogCaptureFixture) -> None:
    # error_detail masks what a failing tool says; a name that does not exist is the
    # caller's mistake, answered as the protocol request answers it.
    async with Client(serving(error_detail="generic").fastmcp, mode=mode) as client:
        await warmed(client, all_logs)
        result = await client.call_tool("get_prompt", {"name": "never_existed"},
                                        raise_on_error=False)
    assert result.is_error and result.content[0].text == "Unknown prompt: 'never_existed'"
    assert noisy(all_logs) == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_prompt_arguments_that_do_not_fit_leave_no_traceback(
        mode: str, all_logs: pytest.LogCaptureFixture) -> None:
    async with Client(serving().fastmcp, mode=mode) as client:
        await warmed(client, all_logs)
        for arguments in ({"query": "q", "limit": "x"}, {"query": "q", "limit": "9" * 5000},
                          {"limit": "3"}, {"query": "q", "colour": "red"}):
            with pytest.raises(MCPError) as caught:
                await client.get_prompt("product_search", arguments)
            assert caught.value.error.code == -32602
            assert caught.value.error.message.startswith("Prompt 'product_search': ")
    assert noisy(all_logs) == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_gate_refusal_inside_a_tool_form_leaves_no_traceback(
        mode: str, all_logs: pytest.LogCaptureFixture) -> None:
    def authorize(gate: GateContext) -> bool:
        return gate.kind != "resource"

    async with Client(serving(authorizer=authorize).fastmcp, mode=mode) as client:
        await warmed(client, all_logs)
        result = await client.call_tool("read_resource", {"uri": SCHEMA.format("order_status")},
                                        raise_on_error=False)
    assert result.is_error and result.content[0].text == "Request refused: forbidden"
    assert noisy(all_logs) == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_real_fault_still_logs_its_traceback(
        mode: str, all_logs: pytest.LogCaptureFixture) -> None:
    server = serving()

    @server.fastmcp.resource("extra://broken")
    def broken() -> str:
        raise RuntimeError("the disk is gone")

    async with Client(server.fastmcp, mode=mode) as client:
        await warmed(client, all_logs)
        result = await client.call_tool("read_resource", {"uri": "extra://broken"},
                                        raise_on_error=False)
        assert result.is_error and "the disk is gone" in result.content[0].text
        faults = [r for r in all_logs.records if r.levelno >= logging.ERROR and r.exc_info]
        assert faults and isinstance(faults[0].exc_info[1], RuntimeError)  # type: ignore[index]
        all_logs.clear()
        with pytest.raises(MCPError):
            await client.read_resource("extra://broken")
    assert [r for r in all_logs.records if r.levelno >= logging.ERROR and r.exc_info]


@pytest.mark.anyio
async def test_a_flow_named_like_a_tool_form_not_enabled_is_served_as_itself() -> None:
    # Only the tool forms a server adds are served this way: with resources_as_tools
    # alone, a flow may be published as "get_prompt" and runs as the flow it is.
    executor = build_catalogue()
    executor.registry.register_flow(Flow("get_prompt", "Quote, by another name.",
                                         [FlowStep("quote_price")]))
    server = FlowServer(executor, expose_schemas=True,
                        serving=ServingConfig(resources_as_tools=True))
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("get_prompt", {"sku": "SKU-1", "quantity": 2})
    assert result.structured_content is not None
    assert result.structured_content["sku"] == "SKU-1"
    assert "chainweaver" in (result.meta or {})  # the flow tool's own result
