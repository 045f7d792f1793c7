"""Per-caller views in memory, on both protocol eras: each caller sees its own flows in
every primitive, and a flow outside its view is a name that never existed."""

from __future__ import annotations

import json
from typing import Any

import mcp_types
import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue
from support.views import NEVER, OWNERS, answer, assert_view, renamed, schema_uri

from chainweaver.errors import ExposureConfigError
from chainweaver.flows import Flow
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FixedWindowRateLimiter,
    FlowServer,
    GateContext,
    SecurityConfig,
    ServingConfig,
    Visibility,
    visible_claim,
)

MODES = ["auto", "legacy"]
TEAMS = {"sam": ["search-team"], "olga": ["orders-team", "pricing-team"],
         "sue": ["search-team"], "nobody": []}
SEES = {"sam": {"product_search", "failing_flow"}, "sue": {"product_search", "failing_flow"},
        "olga": {"order_status", "price_quote"}, "nobody": set()}


class Switch:
    """An authenticator whose caller the test switches: teams ride in a claim."""

    def __init__(self, who: str | None = "sam") -> None:
        self.who = who

    def __call__(self, ctx: GateContext) -> CallerIdentity | None:
        if self.who is None:
            return None
        return CallerIdentity(self.who, {"teams": TEAMS[self.who], "sub": self.who},
                              subject=self.who, scopes=frozenset({"flows"}))


def viewing(visible: Any = None, *, server_options: dict[str, Any] | None = None,
            **security: Any) -> tuple[FlowServer, Switch, list[AuditEvent]]:
    events: list[AuditEvent] = []
    switch = Switch()
    security.setdefault("authenticator", switch)
    security.setdefault("audit_hook", events.append)
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(
                            **security,
                            visible=visible_claim("teams") if visible is None else visible),
                        **(server_options or {}))
    return server, switch, events


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_each_caller_sees_exactly_its_view_in_every_primitive(mode: str) -> None:
    server, switch, _ = viewing()
    async with Client(server.fastmcp, mode=mode) as client:
        for who in ("sam", "olga", "nobody"):
            switch.who = who
            await assert_view(client, SEES[who])
    assert SEES["sam"].isdisjoint(SEES["olga"])


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_hidden_flow_is_audited_like_a_name_that_never_existed(mode: str) -> None:
    server, switch, events = viewing(authorizer=lambda ctx: True)
    switch.who = "olga"
    async with Client(server.fastmcp, mode=mode) as client:
        shapes, answers = [], []
        for name in ("product_search", NEVER):
            events.clear()
            answers.append(renamed(await _each_kind(client, name), name, NEVER))
            shapes.append(renamed([_shape(e) for e in events], name, NEVER))
    assert answers[0] == answers[1]
    assert shapes[0] == shapes[1] and len(shapes[0]) == 6
    assert all(event["flow_name"] is None for event in shapes[0])


async def _each_kind(client: Client, name: str) -> list[dict[str, Any]]:
    session = client.session
    return [await answer(lambda: session.call_tool(name, {"query": "q"})),
            await answer(lambda: session.read_resource(schema_uri(name))),
            await answer(lambda: session.get_prompt(name, {"query": "q"}))]


def _shape(event: AuditEvent) -> dict[str, Any]:
    fields = dict(vars(event))
    for timing in ("timestamp", "duration_ms"):
        fields[timing] = fields[timing] is not None
    return fields


@pytest.mark.anyio
async def test_the_rule_is_asked_once_per_grant_set_and_sees_only_the_grant() -> None:
    asked: list[tuple[CallerIdentity, str]] = []

    def rule(caller: CallerIdentity, flow: Flow) -> bool:
        asked.append((caller, flow.name))
        return OWNERS[flow.name] in caller.claims.get("teams", [])

    server, switch, _ = viewing(Visibility(rule, claims=("teams",)))
    async with Client(server.fastmcp) as client:
        for who in ("sam", "sue", "sam", "olga"):  # sam and sue share one grant set
            switch.who = who
            await client.list_tools()
            await client.call_tool("product_search", {"query": "q"}, raise_on_error=False)
    assert sorted(name for _, name in asked) == sorted(list(OWNERS) * 2)
    for caller, _ in asked:
        assert caller.id == "grant" and caller.subject is None and caller.client_id is None
        assert set(caller.claims) == {"teams"} and caller.scopes == {"flows"}


@pytest.mark.anyio
async def test_a_plain_function_is_keyed_by_scopes_alone() -> None:
    seen: list[CallerIdentity] = []

    def rule(caller: CallerIdentity, flow: Flow) -> bool:
        seen.append(caller)
        return flow.name == "price_quote"

    server, switch, _ = viewing(rule)
    async with Client(server.fastmcp) as client:
        for who in ("sam", "olga"):
            switch.who = who
            assert [t.name for t in await client.list_tools()] == ["price_quote"]
    assert len(seen) == len(OWNERS)  # one grant set: {"flows"}
    assert all(dict(caller.claims) == {} for caller in seen)


@pytest.mark.anyio
async def test_a_broken_or_non_boolean_rule_hides_the_flow(
        all_logs: pytest.LogCaptureFixture) -> None:
    def rule(caller: CallerIdentity, flow: Flow) -> Any:
        if flow.name == "order_status":
            raise RuntimeError("rule bug")
        return "yes" if flow.name == "price_quote" else flow.name == "product_search"

    server, _, _ = viewing(rule)
    async with Client(server.fastmcp) as client:
        assert [t.name for t in await client.list_tools()] == ["product_search"]
    assert "raised RuntimeError for flow 'order_status'" in all_logs.text
    assert "rule bug" not in all_logs.text


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_lists_and_completions_pass_the_gate(mode: str) -> None:
    server, switch, events = viewing()
    switch.who = None
    async with Client(server.fastmcp, mode=mode) as client:
        for request in (client.list_tools, client.list_resources,
                        client.list_resource_templates, client.list_prompts,
                        lambda: client.complete(mcp_types.PromptReference(name="order_status"),
                                                {"name": "order_id", "value": ""})):
            with pytest.raises(MCPError) as caught:
                await request()
            assert caught.value.error.model_dump() == {
                "code": GATE_REFUSED, "message": "Request refused: unauthenticated",
                "data": {"reason": "unauthenticated"}}
    assert [(e.kind, e.name, e.decision) for e in events] == [
        ("list", "tools/list", "denied"), ("list", "resources/list", "denied"),
        ("list", "resources/templates/list", "denied"), ("list", "prompts/list", "denied"),
        ("completion", "order_status", "denied")]


@pytest.mark.anyio
async def test_lists_spend_the_rate_budget() -> None:
    server, _, _ = viewing(rate_limiter=FixedWindowRateLimiter(2, per_name=True))
    async with Client(server.fastmcp) as client:
        await client.list_tools()
        await client.list_tools()
        with pytest.raises(MCPError) as caught:
            await client.list_tools()
        assert caught.value.error.data == {"reason": "rate_limited"}
        await client.list_prompts()  # per name: another budget


@pytest.mark.anyio
async def test_without_hooks_the_view_is_the_anonymous_callers() -> None:
    # No authenticator and no token: everyone is anonymous, whose claims list no team.
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(visible=visible_claim("teams")))
    async with Client(server.fastmcp) as client:
        await assert_view(client, set())


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_tools_only_clients_get_the_same_view(mode: str) -> None:
    server, switch, _ = viewing(server_options={"serving": ServingConfig(
        resources_as_tools=True, prompts_as_tools=True)})
    switch.who = "olga"
    async with Client(server.fastmcp, mode=mode) as client:
        names = {t.name for t in await client.list_tools()}
        assert names == {"order_status", "price_quote", "list_resources", "read_resource",
                         "list_prompts", "get_prompt"}
        listed = json.loads((await client.call_tool("list_resources", {})).content[0].text)
        assert {r.get("uri") for r in listed} == {
            "chainweaver://flows", schema_uri("order_status"), schema_uri("price_quote"),
            None}  # None: the template
        prompts = json.loads((await client.call_tool("list_prompts", {})).content[0].text)
        assert {p["name"].split("__")[0] for p in prompts} == {
            "order_status", "price_quote", "chainweaver_guide"}
        read = await client.call_tool("read_resource", {"uri": schema_uri("order_status")})
        assert json.loads(read.content[0].text)["name"] == "order_status"
        for tool, arguments in (("read_resource", {"uri": schema_uri("{}")}),
                                ("get_prompt", {"name": "{}", "arguments": {"query": "q"}}),
                                ("get_prompt", {"name": "{}__compare",
                                                "arguments": {"first": "a", "second": "b"}})):
            answers = []
            for name in ("product_search", NEVER):
                filled = json.loads(json.dumps(arguments).replace("{}", name))
                result = await client.call_tool(tool, filled, raise_on_error=False)
                assert result.is_error
                answers.append(renamed(result.content[0].text, name, NEVER))
            assert answers[0] == answers[1], answers


def test_view_settings_are_checked() -> None:
    with pytest.raises(ExposureConfigError, match="visible must be"):
        FlowServer(build_catalogue(), security=SecurityConfig(visible="teams"))  # type: ignore[arg-type]
    with pytest.raises(ExposureConfigError, match="claim names"):
        Visibility(lambda c, f: True, claims="teams")  # type: ignore[arg-type]
    with pytest.raises(ExposureConfigError, match="claim name"):
        visible_claim("")
    with pytest.raises(ExposureConfigError, match="needs expose_schemas"):
        FlowServer(build_catalogue(), serving=ServingConfig(resources_as_tools=True))
    with pytest.raises(ExposureConfigError, match="needs expose_prompts"):
        FlowServer(build_catalogue(), serving=ServingConfig(prompts_as_tools=True))


def test_the_sdk_checks_mcp_param_headers_against_the_callers_view_without_a_list() -> None:
    # FastMCP keeps its low-level server private: if this breaks, so does the lookup
    # in chainweaver.mcp.gate.views.install_input_schema_lookup.
    open_server = FlowServer(build_catalogue())
    lookup = open_server.fastmcp._mcp_server.get_tool_input_schema
    assert lookup is not None
    assert lookup("price_quote") == open_server.fastmcp._mcp_server.get_tool_input_schema(
        "price_quote")
    assert lookup("price_quote")["properties"]["sku"]["type"] == "string"
    assert lookup("write_flow") is None and lookup(NEVER) is None
    # With views: only the token caller's view (anonymous here: no flow at all).
    viewed = FlowServer(build_catalogue(), security=SecurityConfig(visible=visible_claim("teams")))
    assert viewed.fastmcp._mcp_server.get_tool_input_schema("price_quote") is None
    # An authenticator decides the caller after this runs: no check rather than a guess.
    hooked, _, _ = viewing()
    assert hooked.fastmcp._mcp_server.get_tool_input_schema("price_quote") is None


def test_the_verified_token_is_the_caller_when_no_authenticator_decides() -> None:
    from fastmcp.server.auth import AccessToken
    from mcp.server.auth.middleware.auth_context import auth_context_var
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

    from chainweaver.mcp.gate.admission import caller as current_caller
    from chainweaver.mcp.gate.admission import caller_from_token

    assert caller_from_token().id == "anonymous"
    for client, claims, expected in (
            ("app", {"sub": "olga", "teams": ["orders-team"]}, "app|olga"),
            ("app", {"teams": []}, "app"),  # no subject: the client alone
            ("other-app", {"sub": "olga"}, "other-app|olga")):  # same text, other verifier
        token = AccessToken(token="tok-1", client_id=client, scopes=["flows"], claims=claims)
        reset = auth_context_var.set(AuthenticatedUser(token))
        try:
            caller = current_caller()
            assert caller is current_caller()  # built once per token
        finally:
            auth_context_var.reset(reset)
        assert caller.id == expected and caller.client_id == client
        assert dict(caller.claims) == claims and caller.scopes == {"flows"}
        assert caller.subject == claims.get("sub")


def test_a_flow_named_like_a_tools_only_tool_refuses_to_start() -> None:
    from chainweaver import Flow, FlowStep

    executor = build_catalogue()
    executor.registry.register_flow(Flow("read_resource", "Clash.",
                                         [FlowStep("search_products")]))
    with pytest.raises(ExposureConfigError, match="read_resource clash"):
        FlowServer(executor, expose_schemas=True, serving=ServingConfig(resources_as_tools=True))


@pytest.mark.anyio
async def test_a_flow_named_like_a_tools_only_tool_is_refused_while_serving_too() -> None:
    from chainweaver import Flow, FlowStep

    executor = build_catalogue()
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        serving=ServingConfig(resources_as_tools=True, prompts_as_tools=True))
    async with Client(server.fastmcp) as client:
        before = sorted(t.name for t in await client.list_tools())
        for name in ("read_resource", "get_prompt"):
            with pytest.raises(ExposureConfigError, match=f"{name} clash"):
                executor.registry.register_flow(Flow(name, "Clash.",
                                                     [FlowStep("search_products")]))
            assert name not in executor.registry.state()
        # The old snapshot keeps serving: the generated tools still answer.
        assert sorted(t.name for t in await client.list_tools()) == before
        read = await client.call_tool("read_resource", {"uri": "chainweaver://flows"})
        assert not read.is_error
