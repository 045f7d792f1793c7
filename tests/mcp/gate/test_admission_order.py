"""One admission per request, in one order: authenticate, resolve the target in *that
caller's* view, rate-limit, authorize, audit.

The case that used to leak: a per-caller view, an ``authenticator`` hook and a
transform on ``server.fastmcp``. The gate looked the renamed name up before it knew the
caller (in the anonymous view, where the flow is hidden), so the authorizer saw no flow,
its per-flow refusal did not hold, and the audit named no flow. Every primitive, both
protocol eras, and every transform that renames or re-exposes components.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from fastmcp.server.transforms import Namespace
from mcp import MCPError
from support.catalogue import build_catalogue

from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    visible_claim,
)

pytestmark = pytest.mark.anyio
MODES = ["auto", "legacy"]  # 2026-07-28, 2025-11-25
DENIED = "order_status"  # in olga's view; her authorizer refuses it
ALLOWED = "price_quote"  # in olga's view too; allowed
FORBIDDEN = {"code": GATE_REFUSED, "message": "Request refused: forbidden",
             "data": {"reason": "forbidden"}}


class Olga:
    """The authenticator hook: the caller (with the teams the view reads) comes from it,
    never from a token, so only the hook knows that this caller may see the flows."""

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity("olga", {"teams": ["orders-team", "pricing-team"]},
                              subject="olga")


class Authorizer:
    def __init__(self) -> None:
        self.seen: list[GateContext] = []

    def __call__(self, ctx: GateContext) -> bool:
        self.seen.append(ctx)
        return ctx.flow_name != DENIED


def served() -> tuple[FlowServer, Authorizer, list[AuditEvent]]:
    events: list[AuditEvent] = []
    authorizer = Authorizer()
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(authenticator=Olga(), authorizer=authorizer,
                                                audit_hook=events.append,
                                                visible=visible_claim("teams")))
    server.fastmcp.add_transform(Namespace("shop"))
    return server, authorizer, events


async def refusal(request: Any) -> dict[str, Any]:
    with pytest.raises(MCPError) as refused:
        await request()
    return refused.value.error.model_dump(exclude_none=True)


@pytest.mark.parametrize("mode", MODES)
async def test_the_authorizer_sees_the_flow_behind_a_renamed_name_in_every_primitive(
        mode: str) -> None:
    server, authorizer, events = served()
    async with Client(server.fastmcp, mode=mode) as client:
        session = client.session
        call = await refusal(lambda: session.call_tool(f"shop_{DENIED}", {"order_id": "A-1"}))
        read = await refusal(lambda: session.read_resource(
            f"chainweaver://shop/flows/{DENIED}/schema"))
        render = await refusal(lambda: session.get_prompt(f"shop_{DENIED}",
                                                          {"order_id": "A-1"}))
        # The allowed flow next to it answers, through the same transform.
        allowed = await session.call_tool(f"shop_{ALLOWED}", {"sku": "SKU-1"})
    assert call == read == render == FORBIDDEN
    assert not allowed.is_error
    decided = [(ctx.kind, ctx.flow_name, ctx.caller.id if ctx.caller else None)
               for ctx in authorizer.seen]
    assert decided == [("tool", DENIED, "olga"), ("resource", DENIED, "olga"),
                       ("prompt", DENIED, "olga"), ("tool", ALLOWED, "olga")]
    refused = [(e.kind, e.flow_name, e.reason) for e in events
               if e.decision == "denied"]
    assert refused == [("tool", DENIED, "forbidden"), ("resource", DENIED, "forbidden"),
                       ("prompt", DENIED, "forbidden")]


@pytest.mark.parametrize("mode", MODES)
async def test_the_authenticator_runs_before_any_name_is_resolved(mode: str) -> None:
    seen: list[GateContext] = []

    def authenticate(ctx: GateContext) -> CallerIdentity:
        seen.append(ctx)
        return Olga()(ctx)

    server = FlowServer(build_catalogue(), expose_schemas=True,
                        security=SecurityConfig(authenticator=authenticate,
                                                visible=visible_claim("teams")))
    server.fastmcp.add_transform(Namespace("shop"))
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.session.call_tool(f"shop_{DENIED}", {"order_id": "A-1"})
    assert not result.is_error  # olga sees it; nobody refuses it
    tool_contexts = [ctx for ctx in seen if ctx.kind == "tool"]
    assert [(ctx.name, ctx.flow_name) for ctx in tool_contexts] == [(f"shop_{DENIED}", None)]


@pytest.mark.parametrize("mode", MODES)
async def test_a_flow_outside_the_callers_view_stays_unknown_to_the_authorizer(
        mode: str) -> None:
    server, authorizer, events = served()
    hidden = "product_search"  # search-team only: not in olga's view
    async with Client(server.fastmcp, mode=mode) as client:
        hidden_answer = await client.session.call_tool(f"shop_{hidden}", {"query": "x"})
        never_answer = await client.session.call_tool("shop_never_existed", {"query": "x"})
    assert hidden_answer.is_error and never_answer.is_error
    assert (hidden_answer.content[0].text.replace(hidden, "NAME")
            == never_answer.content[0].text.replace("never_existed", "NAME"))
    assert all(ctx.flow_name is None for ctx in authorizer.seen)
    assert hidden not in {e.flow_name for e in events}
