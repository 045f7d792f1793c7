"""Change notifications follow each caller's view, in memory, on both protocol eras.

A client is told of a change only when its caller's view changed (a change among flows
outside it says nothing), ``resources/updated`` only for subscribed URIs in that view,
and the subscription requests themselves pass the security gate (over HTTP with JWTs:
tests/e2e/test_live_views_http.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from mcp.client.subscriptions import listen
from support.catalogue import build_catalogue
from support.notices import PROMPTS, RESOURCES, TOOLS, UPDATED, Heard, listening
from support.views import INDEX, schema_uri

from chainweaver import Flow, FlowExecutor, FlowGovernance, FlowStep
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FixedWindowRateLimiter,
    FlowServer,
    GateContext,
    SecurityConfig,
    visible_claim,
)

# Slow: each check waits a bounded quiet window to show that nothing else arrives.
pytestmark = [pytest.mark.anyio, pytest.mark.slow,
              # 2025-11-25 clients subscribe the old way, on purpose.
              pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

MODES = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
# Both see flows owned by "common"; otherwise their views are disjoint.
TEAMS = {"sam": ["search-team", "common"], "olga": ["orders-team", "pricing-team", "common"]}


class Switch:
    """An authenticator whose caller the test switches before each client's requests
    (in memory there are no headers to tell callers apart). A request context it is
    asked about again (a listener's, when there is news) names the caller it named
    then, as the credentials in its headers would."""

    def __init__(self) -> None:
        self.who: str | None = None
        self.asked: list[tuple[GateContext, str | None]] = []

    def __call__(self, ctx: GateContext) -> CallerIdentity | None:
        who = next((who for seen, who in self.asked if seen is ctx), None)
        if who is None:
            who = self.who
            self.asked.append((ctx, who))
        if who is None:
            return None
        return CallerIdentity(who, {"teams": TEAMS[who]}, subject=who)


def serving(visible: Any = "teams", **security: Any
            ) -> tuple[FlowExecutor, FlowServer, Switch, list[AuditEvent]]:
    executor = build_catalogue()
    events: list[AuditEvent] = []
    switch = Switch()
    security.setdefault("authenticator", switch)
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(
                            audit_hook=events.append, **security,
                            visible=visible_claim(visible) if visible else None))
    return executor, server, switch, events


@asynccontextmanager
async def follower(server: FlowServer, switch: Switch, who: str | None, mode: str,
                   uris: list[str]) -> AsyncIterator[Heard]:
    """A client of caller ``who`` that follows changes: subscribed to ``uris`` on a
    2025-11-25 session, or a 2026-07-28 listen stream asking for every kind."""
    heard = Heard()
    switch.who = who
    if mode == "legacy":
        async with Client(server.fastmcp, mode=mode, message_handler=heard) as client:
            for uri in uris:  # gated: the session is admitted as ``who``
                await client.session.subscribe_resource(uri)
            yield heard
        return
    async with Client(server.fastmcp) as client, listening(client.session, heard, uris):
        yield heard


def new_version(executor: FlowExecutor, name: str) -> None:
    current = executor.registry.get_flow(name)
    major = int(current.version.split(".")[0]) + 1
    executor.registry.register_flow(dataclasses.replace(current, version=f"{major}.0.0"))


def updated(*names: str) -> list[str]:
    return [f"{UPDATED} {uri}" for uri in (*map(schema_uri, names), INDEX)]


@pytest.mark.parametrize("mode", MODES)
async def test_a_change_reaches_exactly_the_callers_whose_view_it_is_in(mode: str) -> None:
    executor, server, switch, _ = serving()
    # Both subscribe to a schema in each view (and the index): only their own fire.
    uris = [schema_uri("product_search"), schema_uri("order_status"), INDEX]
    async with follower(server, switch, "sam", mode, uris) as sam, \
            follower(server, switch, "olga", mode, uris) as olga:
        new_version(executor, "product_search")  # in sam's view only
        assert await sam.take(4) == sorted([TOOLS, PROMPTS, *updated("product_search")])
        assert await olga.take(0) == []
        new_version(executor, "order_status")  # in olga's view only
        assert await olga.take(4) == sorted([TOOLS, PROMPTS, *updated("order_status")])
        assert await sam.take(0) == []
        # A flow both see appears: both are told, the same.
        executor.registry.register_flow(Flow(
            "shared_lookup", "Both teams use it.", [FlowStep("search_products")],
            governance=FlowGovernance(owner="common")))
        both = sorted([TOOLS, RESOURCES, PROMPTS, f"{UPDATED} {INDEX}"])
        assert await sam.take(4) == both
        assert await olga.take(4) == both
        # A flow nobody's view holds comes and goes: nobody hears a thing.
        executor.registry.register_flow(Flow(
            "finance_only", "Nobody here sees it.", [FlowStep("search_products")],
            governance=FlowGovernance(owner="finance-team")))
        executor.registry.unregister("finance_only")
        assert await sam.take(0) == [] and await olga.take(0) == []


async def test_a_session_follows_the_caller_last_admitted_on_it() -> None:
    executor, server, switch, _ = serving()
    heard = Heard()
    async with Client(server.fastmcp, mode="legacy", message_handler=heard) as client:
        switch.who = None
        with pytest.raises(MCPError):
            await client.list_tools()  # refused: still no caller on this session
        new_version(executor, "product_search")
        assert await heard.take(0) == []  # a session no caller was admitted on
        switch.who = "sam"
        await client.list_tools()
        switch.who = "olga"
        await client.list_tools()  # the same session, now admitted as olga
        new_version(executor, "product_search")
        assert await heard.take(0) == []
        new_version(executor, "price_quote")
        assert await heard.take(2) == sorted([TOOLS, PROMPTS])


@pytest.mark.parametrize("mode", MODES)
async def test_without_a_view_rule_every_admitted_client_hears_every_change(
        mode: str) -> None:
    executor, server, switch, _ = serving(visible=None)
    async with follower(server, switch, "sam", mode, [schema_uri("order_status")]) as sam:
        new_version(executor, "order_status")
        assert await sam.take(3) == sorted([TOOLS, PROMPTS, *updated("order_status")[:1]])


@pytest.mark.parametrize("mode", MODES)
async def test_an_unauthenticated_subscription_is_refused_and_audited(mode: str) -> None:
    executor, server, switch, events = serving()
    method = "resources/subscribe" if mode == "legacy" else "subscriptions/listen"
    async with Client(server.fastmcp, mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            if mode == "legacy":
                await client.session.subscribe_resource(schema_uri("product_search"))
            else:
                async with listen(client.session, tools_list_changed=True):
                    pass
        if mode == "legacy":
            with pytest.raises(MCPError) as also:
                await client.session.unsubscribe_resource(schema_uri("product_search"))
            assert also.value.error.code == GATE_REFUSED
    error = refused.value.error
    assert (error.code, error.message) == (GATE_REFUSED, "Request refused: unauthenticated")
    assert error.data == {"reason": "unauthenticated"}
    audited = [(e.kind, e.name, e.phase, e.decision, e.reason, e.caller_id, e.flow_name)
               for e in events]
    assert audited[0] == ("subscription", method, "decision", "denied", "unauthenticated",
                          None, None)
    if mode == "legacy":
        assert audited[1][1] == "resources/unsubscribe"
    assert len(audited) == (2 if mode == "legacy" else 1)


@pytest.mark.parametrize("mode", MODES)
async def test_an_admitted_subscription_is_audited_and_rate_limited(mode: str) -> None:
    executor, server, switch, events = serving(
        rate_limiter=FixedWindowRateLimiter(1, 3600))
    async with follower(server, switch, "sam", mode, [schema_uri("product_search")]) as sam:
        new_version(executor, "product_search")
        assert f"{UPDATED} {schema_uri('product_search')}" in await sam.take(1)
        # The budget (one request) is spent: the next subscription is refused.
        async with Client(server.fastmcp, mode=mode) as client:
            with pytest.raises(MCPError) as refused:
                if mode == "legacy":
                    await client.session.subscribe_resource(INDEX)
                else:
                    async with listen(client.session, tools_list_changed=True):
                        pass
    assert refused.value.error.data == {"reason": "rate_limited"}
    method = "resources/subscribe" if mode == "legacy" else "subscriptions/listen"
    audited = [(e.kind, e.name, e.phase, e.decision, e.reason, e.caller_id) for e in events]
    assert audited[0] == ("subscription", method, "decision", "allowed", "ok", "sam")
    assert ("subscription", method, "decision", "denied", "rate_limited", "sam") in audited
    completed = [e for e in events if e.phase == "completed"]
    assert completed and completed[0].kind == "subscription"
    # The listen stream's request lasts as long as the stream: it ends when the client
    # leaves; a subscribe request ends at once.
    assert completed[0].outcome in (("ok",) if mode == "legacy" else ("ok", "cancelled"))


class Teams:
    """Sam's teams, as the authenticator answers for his credentials now."""

    def __init__(self) -> None:
        self.teams = ["search-team", "orders-team"]

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity("sam", {"teams": list(self.teams)}, subject="sam")


@pytest.mark.parametrize("mode", MODES)
async def test_a_listener_stops_hearing_of_a_flow_that_left_its_callers_view(
        mode: str) -> None:
    """A listen stream (or a 2025-11-25 session that makes no request since) was told
    of changes in the view its caller had when it was admitted: after the
    authenticator stopped giving sam the search team, it still heard that
    ``product_search`` changed (list_changed, and resources/updated for its URI),
    where a name that never existed says nothing. The authenticator is asked again
    (with the listener's request context) when there is news."""
    executor, server, _, _ = serving(authenticator=(teams := Teams()))
    uris = [schema_uri("product_search"), schema_uri("order_status"), INDEX]
    async with follower(server, Switch(), None, mode, uris) as heard:
        teams.teams = ["orders-team"]  # no request made since
        new_version(executor, "product_search")
        assert await heard.take(0) == []
        new_version(executor, "order_status")  # still in view: heard
        assert await heard.take(4) == sorted([TOOLS, PROMPTS, *updated("order_status")])
        teams.teams = []
        new_version(executor, "order_status")  # nobody the hook admits: nothing
        assert await heard.take(0) == []
        teams.teams = ["search-team"]
        new_version(executor, "product_search")  # back in view
        assert await heard.take(4) == sorted([TOOLS, PROMPTS, *updated("product_search")])
