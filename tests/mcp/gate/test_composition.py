"""FastMCP composition never routes around the security gate or reshapes its refusals.

Renaming transforms on ``server.fastmcp`` keep per-flow authorization; a server
mounted with ``FlowServer.mount_into`` refuses exactly as it does standing alone,
with nothing logged at ERROR; a bare ``FastMCP.mount()`` of a gated server is
refused loudly instead of being served unguarded.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import mcp_types
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.transforms import Namespace, ToolTransform
from fastmcp.tools.tool_transform import ToolTransformConfig
from mcp import MCPError
from support.catalogue import CALLS, build_catalogue

from chainweaver import ExposureConfigError
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    FlowServer,
    GateContext,
    SecurityConfig,
)

ALLOWED_FLOW = "price_quote"


def gated(events: list[AuditEvent], seen: list[GateContext]) -> FlowServer:
    """A server whose authorizer allows one flow only, judged by the flow's name."""

    def authorize(context: GateContext) -> bool:
        seen.append(context)
        return context.flow_name == ALLOWED_FLOW

    return FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(authorizer=authorize, audit_hook=events.append))


async def refusal(client: Client, kind: str, name: str) -> dict[str, Any]:
    with pytest.raises(MCPError) as caught:
        if kind == "tool":
            await client.call_tool(name, {"query": "q"})
        elif kind == "resource":
            await client.read_resource(name)
        else:
            await client.get_prompt(name, {"query": "q"})
    return caught.value.error.model_dump()


FORBIDDEN = {"code": GATE_REFUSED, "message": "Request refused: forbidden",
             "data": {"reason": "forbidden"}}


@pytest.mark.anyio
async def test_a_namespace_transform_keeps_per_flow_authorization() -> None:
    events: list[AuditEvent] = []
    seen: list[GateContext] = []
    server = gated(events, seen)
    server.fastmcp.add_transform(Namespace("shop"))
    async with Client(server.fastmcp) as client:
        names = {tool.name for tool in await client.list_tools()}
        assert {"shop_price_quote", "shop_product_search"} <= names
        allowed = await client.call_tool("shop_price_quote", {"sku": "SKU-1"})
        assert not allowed.is_error
        assert await refusal(client, "tool", "shop_product_search") == FORBIDDEN
        assert await refusal(client, "prompt", "shop_product_search") == FORBIDDEN
        assert await refusal(client, "resource",
                             "chainweaver://shop/flows/product_search/schema") == FORBIDDEN
    # The hooks saw the renamed names with the real flow behind them.
    assert [(c.kind, c.name, c.flow_name) for c in seen[:2]] == [
        ("tool", "shop_price_quote", "price_quote"),
        ("tool", "shop_product_search", "product_search")]
    assert {e.flow_name for e in events if e.kind != "list"} == {"price_quote",
                                                                 "product_search"}


@pytest.mark.anyio
async def test_a_rename_cannot_move_a_denied_flow_under_an_allowed_name() -> None:
    events: list[AuditEvent] = []
    seen: list[GateContext] = []
    server = gated(events, seen)
    # The denied flow's tool takes the allowed flow's published name, and vice versa.
    server.fastmcp.add_transform(ToolTransform({
        "product_search": ToolTransformConfig(name="price_quote"),
        "price_quote": ToolTransformConfig(name="product_search"),
    }))
    before = CALLS.copy()
    async with Client(server.fastmcp) as client:
        assert await refusal(client, "tool", "price_quote") == FORBIDDEN
        allowed = await client.call_tool("product_search", {"sku": "SKU-1"})
        assert not allowed.is_error
    assert CALLS["search_products"] == before["search_products"]  # never ran
    assert [c.flow_name for c in seen] == ["product_search", "price_quote"]


@pytest.mark.anyio
@pytest.mark.parametrize("namespace", ["shop", None])
async def test_mount_into_refuses_like_a_standalone_server_without_error_logs(
    namespace: str | None, all_logs: pytest.LogCaptureFixture,
) -> None:
    standalone_events: list[AuditEvent] = []
    async with Client(gated(standalone_events, []).fastmcp) as client:
        standalone = await refusal(client, "tool", "product_search")

    events: list[AuditEvent] = []
    server = gated(events, [])
    parent = FastMCP("parent")
    server.mount_into(parent, namespace=namespace)
    prefix = f"{namespace}_" if namespace else ""
    uri = ("chainweaver://shop/flows/product_search/schema" if namespace
           else "chainweaver://flows/product_search/schema")
    before = CALLS.copy()
    all_logs.clear()
    async with Client(parent) as client:
        assert await refusal(client, "tool", f"{prefix}product_search") == standalone
        assert await refusal(client, "prompt", f"{prefix}product_search") == FORBIDDEN
        assert await refusal(client, "resource", uri) == FORBIDDEN
        allowed = await client.call_tool(f"{prefix}price_quote", {"sku": "SKU-1"})
        assert not allowed.is_error
    assert CALLS["search_products"] == before["search_products"]
    assert not [r for r in all_logs.records if r.levelno >= logging.ERROR]
    # Audited once per request, by the parent-side gate, under the name the client used.
    # (Lists through the parent are audited too, as standalone: not counted here.)
    decisions = [(e.name, e.decision) for e in events
                 if e.phase == "decision" and e.kind != "list"]
    assert decisions == [(f"{prefix}product_search", "denied"),
                         (f"{prefix}product_search", "denied"), (uri, "denied"),
                         (f"{prefix}price_quote", "allowed")]


@pytest.mark.anyio
async def test_a_bare_fastmcp_mount_of_a_gated_server_is_refused_loudly(
    all_logs: pytest.LogCaptureFixture,
) -> None:
    server = gated([], [])
    parent = FastMCP("parent")
    parent.mount(server.fastmcp, namespace="shop")
    before = CALLS.copy()
    async with Client(parent) as client:
        result = await client.call_tool("shop_price_quote", {"sku": "SKU-1"},
                                        raise_on_error=False)
    # Even the flow the authorizer allows is not served: the gate cannot vouch for it.
    assert result.is_error
    assert CALLS == before
    assert any("mount_into" in r.getMessage() for r in all_logs.records
               if r.levelno >= logging.ERROR)


@pytest.mark.anyio
async def test_a_server_without_hooks_mounts_either_way() -> None:
    server = FlowServer(build_catalogue())
    parent = FastMCP("parent")
    parent.mount(server.fastmcp, namespace="shop")
    async with Client(parent) as client:
        result = await client.call_tool("shop_price_quote", {"sku": "SKU-1"})
    assert not result.is_error


def test_mount_into_checks_its_arguments() -> None:
    server = FlowServer(build_catalogue())
    with pytest.raises(ExposureConfigError, match="parent"):
        server.mount_into(server.fastmcp)
    with pytest.raises(ExposureConfigError, match="namespace"):
        server.mount_into(FastMCP("parent"), namespace="bad name\n")
    parent = FastMCP("parent")
    server.mount_into(parent, namespace="one")
    with pytest.raises(ExposureConfigError, match="mounted into that parent already"):
        server.mount_into(parent, namespace="two")  # one gate, one route per parent
    server.mount_into(FastMCP("another"), namespace="two")  # another parent: fine


# ------------------------------------------------- found by the adversarial review


@pytest.mark.anyio
async def test_a_rename_on_the_parent_after_mount_into_keeps_per_flow_authorization() -> None:
    seen: list[GateContext] = []
    server = gated([], seen)
    parent = FastMCP("parent")
    server.mount_into(parent, namespace="shop")
    parent.add_transform(ToolTransform({
        "shop_product_search": ToolTransformConfig(name="shop_price_quote"),
        "shop_price_quote": ToolTransformConfig(name="shop_product_search"),
    }))
    before = CALLS.copy()
    async with Client(parent) as client:
        assert await refusal(client, "tool", "shop_price_quote") == FORBIDDEN
    assert CALLS["search_products"] == before["search_products"]
    assert [c.flow_name for c in seen] == ["product_search"]


@pytest.mark.anyio
async def test_a_name_the_parent_hides_answers_like_one_that_never_existed() -> None:
    server = gated([], [])
    parent = FastMCP("parent")
    server.mount_into(parent, namespace="shop")
    parent.disable(names={"shop_product_search"})
    async with Client(parent) as client:
        hidden = await client.call_tool("shop_product_search", {"query": "q"},
                                        raise_on_error=False)
        never = await client.call_tool("shop_never_existed", {"query": "q"},
                                       raise_on_error=False)
    assert hidden.content[0].text == "Unknown tool: 'shop_product_search'"
    assert never.content[0].text == "Unknown tool: 'shop_never_existed'"


@pytest.mark.anyio
async def test_two_servers_with_the_same_names_in_one_parent_each_keep_their_gate() -> None:
    first_seen: list[GateContext] = []
    second_seen: list[GateContext] = []
    first, second = gated([], first_seen), gated([], second_seen)
    parent = FastMCP("parent")
    first.mount_into(parent)
    second.mount_into(parent, namespace="two")
    async with Client(parent) as client:
        assert not (await client.call_tool("price_quote", {"sku": "S"})).is_error
        assert not (await client.call_tool("two_price_quote", {"sku": "S"})).is_error
        assert await refusal(client, "tool", "two_product_search") == FORBIDDEN
    assert [c.name for c in first_seen] == ["price_quote"]
    assert [c.name for c in second_seen] == ["two_price_quote", "two_product_search"]


@pytest.mark.anyio
async def test_a_malformed_prompt_request_through_mount_into_is_gated_and_named() -> None:
    events: list[AuditEvent] = []
    server = gated(events, [])
    parent = FastMCP("parent")
    server.mount_into(parent, namespace="shop")
    wire = mcp_types.GetPromptRequestParams.model_construct(
        name="shop_price_quote", arguments={"sku": 5})
    async with Client(parent) as client:
        with pytest.raises(MCPError) as caught, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            await client.session.send_request(mcp_types.GetPromptRequest(params=wire),
                                              mcp_types.GetPromptResult)
    assert caught.value.error.model_dump() == {
        "code": -32602, "data": None,
        "message": "Prompt 'shop_price_quote': argument 'sku' must be a string, got number"}
    assert [(e.name, e.phase) for e in events] == [("shop_price_quote", "decision"),
                                                   ("shop_price_quote", "completed")]


@pytest.mark.anyio
async def test_every_published_component_carries_its_servers_owner_mark() -> None:
    first, second = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True), \
        FlowServer(build_catalogue())
    async with Client(first.fastmcp) as client:
        marks = {c.meta["chainweaver"]["server"]
                 for listing in (await client.list_tools(), await client.list_resources(),
                                 await client.list_prompts()) for c in listing}
    async with Client(second.fastmcp) as client:
        other = {t.meta["chainweaver"]["server"] for t in await client.list_tools()}
    assert len(marks) == 1 and len(other) == 1 and marks != other
