"""The server card at ``<endpoint>/server-card``, through the FlowServer's own ASGI app
(no port): it validates against the server-card extension's schema, names exactly what
the caller's lists show, and its ETag, 304s, size and caching headers tell a caller
nothing about flows outside its view."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.server.auth.providers.jwt import JWTVerifier
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.catalogue import build_catalogue, opted_out_catalogue
from support.server_card import (
    CARD_PATH,
    asgi_client,
    check_card,
    check_registry_entry,
    primitives,
    prompt_names,
    resource_uris,
    tool_names,
)
from support.tokens import AUDIENCE, ISSUER, KeyPair

from chainweaver import Flow, FlowExecutor, FlowGovernance, FlowRegistry, FlowStep
from chainweaver.mcp import Discovery, FlowServer, SecurityConfig, ServingConfig, visible_claim
from chainweaver.mcp.hooks import CallerIdentity, GateContext
from chainweaver.mcp.publish.card import CARD_MEDIA_TYPE

SEARCH = {"product_search", "failing_flow"}
ORDERS = {"order_status", "price_quote"}
# Registered in the catalogue but never exposed: no card may mention them. (The flow
# "needs_approval" is excluded too, but its name is also a key of every tool's metadata.)
EXCLUDED = {"draft_report", "archived_search", "unknown_safety", "write_flow",
            "idempotent_write", "destructive_flow", "external_flow"}
KEYS = KeyPair()


def viewed_server(**options: Any) -> FlowServer:
    verifier = JWTVerifier(public_key=KEYS.public_pem, issuer=ISSUER, audience=AUDIENCE)
    return FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(auth=verifier, visible=visible_claim("teams")),
                      **options)


def bearer(subject: str, teams: list[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS.token(subject, teams)}"}


def mentions(body: bytes, names: set[str]) -> set[str]:
    text = body.decode()
    return {name for name in names if name in text}


@pytest.mark.anyio
async def test_the_anonymous_card_validates_and_names_what_the_lists_show() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    async with asgi_client(server) as http:
        response = await http.get(CARD_PATH)
    assert response.status_code == 200
    assert response.headers["content-type"] == CARD_MEDIA_TYPE
    card = response.json()
    check_card(card)
    assert card["remotes"] == [{"type": "streamable-http", "url": "http://127.0.0.1:8000/mcp",
                                "supportedProtocolVersions": ["2025-11-25", "2026-07-28"]}]
    async with Client(server.fastmcp) as client:
        tools = await client.list_tools()
        resources = await client.list_resources()
        templates = await client.list_resource_templates()
        prompts = await client.list_prompts()
    listed = {tool.name: tool for tool in tools}
    assert tool_names(card) == set(listed) == SEARCH | ORDERS
    for tool in primitives(card)["tools"]:  # the schemas the tool advertises, as listed
        assert tool["inputSchema"] == listed[tool["name"]].input_schema
    assert resource_uris(card) == {str(resource.uri) for resource in resources}
    assert [t["uriTemplate"] for t in primitives(card)["resourceTemplates"]] == \
        [t.uri_template for t in templates]
    assert prompt_names(card) == {prompt.name for prompt in prompts}
    assert not mentions(response.content, EXCLUDED)
    assert server.server_card() == card  # what `chainweaver card` prints


@pytest.mark.anyio
async def test_each_caller_gets_its_own_views_card_and_nothing_else() -> None:
    server = viewed_server()
    async with asgi_client(server) as http:
        sam = await http.get(CARD_PATH, headers=bearer("sam", ["search-team"]))
        olga = await http.get(CARD_PATH, headers=bearer("olga", ["orders-team",
                                                                 "pricing-team"]))
        nina = await http.get(CARD_PATH, headers=bearer("nina", []))
        anonymous = await http.get(CARD_PATH)
        forged = await http.get(CARD_PATH, headers={"Authorization": "Bearer not-a-jwt"})
    for response in (sam, olga, nina, anonymous):
        assert response.status_code == 200
        check_card(response.json())
    assert tool_names(sam.json()) == SEARCH
    assert not mentions(sam.content, ORDERS | EXCLUDED)
    assert tool_names(olga.json()) == ORDERS
    assert not mentions(olga.content, SEARCH | EXCLUDED)
    for empty in (nina, anonymous):
        assert not mentions(empty.content, SEARCH | ORDERS | EXCLUDED)
        assert not primitives(empty.json())["tools"]
    # The remote says it wants a bearer token; the card carries none.
    assert anonymous.json()["remotes"][0]["headers"][0]["name"] == "Authorization"
    assert forged.status_code == 401
    assert forged.headers["www-authenticate"].startswith("Bearer")
    assert server.server_card()["_meta"] == anonymous.json()["_meta"]


@pytest.mark.anyio
async def test_odd_requests_get_clear_answers_and_the_server_keeps_serving() -> None:
    server = viewed_server()
    sam = bearer("sam", ["search-team"])
    async with asgi_client(server) as http:
        basic = await http.get(CARD_PATH, headers={"Authorization": "Basic c2FtOnB3"})
        junk_tag = await http.get(CARD_PATH, headers={**sam, "If-None-Match": 'W/"x", ,*x'})
        posted = await http.post(CARD_PATH, headers=sam, content=b"{}")
        query = await http.get(CARD_PATH + "?x=1", headers=sam)
        fine = await http.get(CARD_PATH, headers=sam)
    assert basic.status_code == 200 and not primitives(basic.json())["tools"]
    assert junk_tag.status_code == 200
    assert posted.status_code == 405
    assert query.json()["remotes"] == fine.json()["remotes"]
    assert tool_names(fine.json()) == SEARCH


class OneEach:
    """A rate limiter granting each caller one request per name."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        allowed = (caller.id, name) not in self.seen
        self.seen.append((caller.id, name))
        return allowed


@pytest.mark.anyio
async def test_card_requests_are_rate_limited_and_audited_like_lists() -> None:
    limiter, events = OneEach(), []
    server = FlowServer(build_catalogue(), security=SecurityConfig(
        rate_limiter=limiter, audit_hook=events.append))
    async with asgi_client(server) as http:
        first = await http.get(CARD_PATH)
        second = await http.get(CARD_PATH)
    assert first.status_code == 200
    assert (second.status_code, second.json()) == (429, {"error": "rate_limited"})
    assert limiter.seen == [("anonymous", "server-card")] * 2
    assert [(e.kind, e.name, e.decision, e.reason) for e in events] == [
        ("list", "server-card", "allowed", "ok"), ("list", "server-card", "denied",
                                                   "rate_limited")]


def failing_authenticator(ctx: GateContext) -> CallerIdentity:
    raise RuntimeError("the user directory is down")


@pytest.mark.anyio
async def test_a_card_the_gate_refuses_is_audited_once_with_the_gates_reason() -> None:
    """The HTTP guard audits the token check's refusals (401/403 with a Bearer
    challenge); it used to audit every 403, so a card the gate refused (audited there)
    was audited a second time, as a token without a scope (``insufficient_scope``)."""
    events: list[Any] = []
    verifier = JWTVerifier(public_key=KEYS.public_pem, issuer=ISSUER, audience=AUDIENCE)
    server = FlowServer(build_catalogue(), security=SecurityConfig(
        authenticator=failing_authenticator, audit_hook=events.append))
    checked = FlowServer(build_catalogue(), security=SecurityConfig(
        auth=verifier, audit_hook=events.append))
    async with asgi_client(server) as http:
        refused = await http.get(CARD_PATH)
    assert (refused.status_code, refused.json()) == (403, {"error": "authenticator_error"})
    assert [(e.kind, e.name, e.decision, e.reason) for e in events] == [
        ("list", "server-card", "denied", "authenticator_error")]
    events.clear()
    async with asgi_client(checked) as http:
        forged = await http.get(CARD_PATH, headers={"Authorization": "Bearer not-a-jwt"})
    assert forged.status_code == 401  # the token check's refusal: still audited
    assert [(e.kind, e.name, e.decision, e.reason) for e in events] == [
        ("http", CARD_PATH, "denied", "unauthenticated")]


@pytest.mark.anyio
async def test_an_opted_out_flow_is_never_named() -> None:
    server = FlowServer(opted_out_catalogue("product_search"), expose_schemas=True,
                        expose_prompts=True)
    async with asgi_client(server) as http:
        card = await http.get(CARD_PATH)
    assert "product_search" not in card.text
    assert tool_names(card.json()) == {"failing_flow"} | ORDERS


@pytest.mark.anyio
async def test_the_etag_holds_until_a_change_inside_the_callers_view() -> None:
    server = viewed_server()
    registry = server.executor.registry
    sam, olga = bearer("sam", ["search-team"]), bearer("olga", ["orders-team"])
    async with asgi_client(server) as http:
        first = await http.get(CARD_PATH, headers=sam)
        olga_first = await http.get(CARD_PATH, headers=olga)
        tag = first.headers["etag"]
        again = await http.get(CARD_PATH, headers={**sam, "If-None-Match": tag})
        assert (again.status_code, again.content) == (304, b"")
        assert again.headers["etag"] == tag
        # A governance change outside sam's view: sam cannot tell it happened.
        registry.set_lifecycle("order_status", "archived")
        outside = await http.get(CARD_PATH, headers={**sam, "If-None-Match": tag})
        assert (outside.status_code, outside.headers["etag"]) == (304, tag)
        assert (await http.get(CARD_PATH, headers=sam)).content == first.content
        olga_after = await http.get(CARD_PATH, headers=olga)
        assert olga_after.headers["etag"] != olga_first.headers["etag"]
        assert "order_status" not in olga_after.text
        # One inside it: a new card, without the flow.
        registry.set_lifecycle("failing_flow", "archived")
        inside = await http.get(CARD_PATH, headers={**sam, "If-None-Match": tag})
    assert inside.status_code == 200
    assert inside.headers["etag"] != tag
    assert tool_names(inside.json()) == {"product_search"}


@pytest.mark.anyio
async def test_caching_headers_say_private_for_a_card_that_depends_on_the_caller() -> None:
    async with asgi_client(viewed_server(discovery=Discovery(cache_ttl=30))) as http:
        per_caller = await http.get(CARD_PATH, headers=bearer("sam", ["search-team"]))
    assert per_caller.headers["cache-control"] == "private, max-age=30"
    assert per_caller.headers["vary"] == "Authorization"
    assert per_caller.headers["access-control-allow-origin"] == "*"
    shared = FlowServer(build_catalogue(), discovery=Discovery(cache_ttl=30))
    async with asgi_client(shared) as http:
        public = await http.get(CARD_PATH)
        preflight = await http.options(CARD_PATH)
    assert public.headers["cache-control"] == "public, max-age=30"
    assert preflight.status_code == 204
    assert "If-None-Match" in preflight.headers["access-control-allow-headers"]
    async with asgi_client(FlowServer(build_catalogue())) as http:
        default = await http.get(CARD_PATH)
    assert default.headers["cache-control"] == "public, no-cache"  # revalidate: ETag


def test_the_registry_entry_names_the_anonymous_view() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True,
                        serving=ServingConfig(instructions="Order tools.\nMore."),
                        discovery=Discovery(registry_name="io.github.acme/orders"))
    entry = server.registry_entry(url="https://mcp.acme.test/mcp",
                                  pypi=("acme-orders", "1.2.0"))
    check_registry_entry(entry)
    assert entry["name"] == "io.github.acme/orders"
    assert entry["description"] == "Order tools."
    assert entry["packages"][0]["identifier"] == "acme-orders"
    names = entry["_meta"]["io.modelcontextprotocol.registry/publisher-provided"]
    assert set(names["chainweaver"]["tools"]) == SEARCH | ORDERS
    assert not mentions(json.dumps(entry).encode(), EXCLUDED)
    guarded = viewed_server().registry_entry(url="https://mcp.acme.test/mcp")
    check_registry_entry(guarded)
    assert guarded["_meta"][
        "io.modelcontextprotocol.registry/publisher-provided"]["chainweaver"]["tools"] == []


# ------------------------------------------------- property: callers and views

TEAMS = ("red", "green", "blue")


def flow_name(number: int) -> str:
    return f"flow{number}z"  # no name is part of another


def team_caller(context: GateContext) -> CallerIdentity:
    teams = context.headers.get("x-teams", "")
    return CallerIdentity(f"caller-{teams}", {"teams": teams.split()})


FLOWS = st.lists(st.tuples(st.sampled_from((*TEAMS, None)), st.booleans(), st.booleans()),
                 min_size=1, max_size=8)
CALLERS = st.lists(st.frozensets(st.sampled_from(TEAMS)), min_size=1, max_size=4)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flows=FLOWS, callers=CALLERS, changed=st.integers(min_value=0, max_value=7))
@pytest.mark.anyio
async def test_no_card_names_a_flow_outside_its_view(
        flows: list[tuple[str | None, bool, bool]], callers: list[frozenset[str]],
        changed: int) -> None:
    """Flows (owner, active, published) and callers (teams) at random: each caller's
    card names exactly the flows its view holds; a change to a flow outside the view
    keeps its ETag, and hidden names never appear in the card's bytes."""
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    from support.catalogue import search_products
    executor.register_tool(search_products)
    for number, (owner, active, published) in enumerate(flows):
        registry.register_flow(Flow(
            flow_name(number), "A flow.", [FlowStep("search_products")],
            governance=FlowGovernance("active" if active else "archived", owner=owner,
                                      publish=published)))
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(authenticator=team_caller,
                                                visible=visible_claim("teams")))
    names = {flow_name(number) for number in range(len(flows))}

    def view_of(teams: frozenset[str]) -> set[str]:
        return {flow_name(number) for number, (owner, active, published) in enumerate(flows)
                if owner in teams and active and published}

    async with asgi_client(server) as http:
        tags = {}
        for teams in callers:
            headers = {"x-teams": " ".join(sorted(teams))}
            response = await http.get(CARD_PATH, headers=headers)
            check_card(response.json())
            assert tool_names(response.json()) == view_of(teams)
            assert not mentions(response.content, names - view_of(teams))
            tags[teams] = response.headers["etag"]
        target = changed % len(flows)
        owner, active, published = flows[target]
        if active:
            registry.set_lifecycle(flow_name(target), "archived")
        else:
            registry.unregister(flow_name(target))
        flows[target] = (owner, False, published)
        for teams in callers:
            headers = {"x-teams": " ".join(sorted(teams)), "If-None-Match": tags[teams]}
            response = await http.get(CARD_PATH, headers=headers)
            was_visible = owner in teams and active and published
            assert response.status_code == (200 if was_visible else 304)
            if response.status_code == 200:
                assert tool_names(response.json()) == view_of(teams)
                assert not mentions(response.content, names - view_of(teams))
