"""Prompts (``expose_prompts=True``) through a real MCP client: schema-derived invocation
prompts, authored and server-level prompts, the guide, errors, completion, gate and audit.
"""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import CALLS, EXPOSED, build_catalogue
from support.mcp_client import (
    EXCLUDED_NAMES,
    GUIDE,
    NEVER,
    NOTICE,
    assert_acceptance,
    complete,
    example_for,
    invalid,
    prompt_error,
    prompting,
    published_meta,
    raw_prompt_error,
    text_of,
)

from chainweaver import (
    ExposureConfigError,
    Flow,
    FlowPrompt,
    FlowStep,
    PromptArgument,
    PromptMessage,
)
from chainweaver.mcp import (
    AuditEvent,
    AuthorizationDecision,
    ExposurePolicy,
    FlowServer,
    GateContext,
    SecurityConfig,
)

# ----------------------------------------------------------------- listing


@pytest.mark.anyio
async def test_flag_off_lists_no_prompts_and_names_are_unknown() -> None:
    server = FlowServer(build_catalogue())
    async with Client(server.fastmcp) as client:
        assert await client.list_prompts() == []
        for name in ("product_search", GUIDE):
            assert (await prompt_error(client, name)).model_dump() == {
                "code": -32602, "message": f"Unknown prompt: {name!r}", "data": None}
    assert server.prompt_names == []


@pytest.mark.anyio
async def test_every_exposed_flow_gets_an_invocation_prompt_named_like_its_tool() -> None:
    server = prompting()
    async with Client(server.fastmcp) as client:
        prompts = {p.name: p for p in await client.list_prompts()}
        tools = {t.name: t for t in await client.list_tools()}
    assert set(prompts) == set(EXPOSED) | {GUIDE, "product_search__compare",
                                           "product_search__brief"}
    assert server.prompt_names == sorted(prompts)
    for name, listed in tools.items():
        prompt = prompts[name]
        assert prompt.title == listed.title and prompt.description == listed.description
        assert [a.name for a in prompt.arguments] == list(listed.input_schema["properties"])
        required = set(listed.input_schema.get("required", ()))
        for argument in prompt.arguments:
            prop = listed.input_schema["properties"][argument.name]
            assert argument.required is (argument.name in required and "default" not in prop)
        assert published_meta(prompt) == {"flow": listed.meta["chainweaver"]["flow"],
                                              "version": listed.meta["chainweaver"]["version"],
                                              "tool": name}


@pytest.mark.anyio
async def test_argument_descriptions_give_type_allowed_values_default_and_examples() -> None:
    async with Client(prompting().fastmcp) as client:
        prompts = {p.name: p for p in await client.list_prompts()}
    search = {a.name: a for a in prompts["product_search"].arguments}
    assert search["query"].description == "What to look for. Type: string. Examples: red shoes."
    assert search["query"].required is True
    assert search["limit"].description == (
        "Maximum number of results. Type: integer. Default: 5.")
    assert search["sort"].description == (
        "Result order. Type: string. Allowed values: relevance, price. Default: relevance.")
    assert search["in_stock"].description == (
        "Only items in stock. Type: boolean. Default: false.")
    assert not any(search[n].required for n in ("limit", "sort", "in_stock"))
    quote = {a.name: a for a in prompts["price_quote"].arguments}
    assert quote["tags"].description == (
        "Optional labels. Type: array (JSON text).")
    assert prompts[GUIDE].arguments == []


@pytest.mark.anyio
async def test_prefixed_servers_name_prompts_after_the_prefixed_tools() -> None:
    server = prompting(policy=ExposurePolicy(server_prefix="shop"))
    async with Client(server.fastmcp) as client:
        names = {p.name for p in await client.list_prompts()}
        result = await client.get_prompt("shop__order_status", {"order_id": "A-5"})
    assert names == {f"shop__{n}" for n in EXPOSED} | {
        GUIDE, "shop__product_search__compare", "shop__product_search__brief"}
    assert result.meta["chainweaver"]["tool"] == "shop__order_status"
    assert "Call the tool `shop__order_status`" in text_of(result)
    report = {e.flow_name: e for e in server.exposure_report()}
    assert report["product_search"].prompt_names == (
        "shop__product_search", "shop__product_search__compare", "shop__product_search__brief")
    for name in EXCLUDED_NAMES:
        assert report[name].prompt_names == ()


# --------------------------------------------------------------- rendering


@pytest.mark.anyio
async def test_the_invocation_prompt_guides_the_model_to_one_tool_call() -> None:
    async with Client(prompting(expose_schemas=True).fastmcp) as client:
        result = await client.get_prompt("order_status", {"order_id": "A-77"})
    assert result.description == "Look up an order and summarise where it is."
    assert [m.role for m in result.messages] == ["user"]
    text = text_of(result)
    assert text.startswith("Call the tool `order_status` (Order Status, flow version 2.1.0).")
    assert "What it does: Look up an order and summarise where it is." in text
    assert "one deterministic tool call" in text
    assert "Safety: read-only." in text and "Approval: not required." in text
    assert "- summary (string): One line for the customer" in text
    assert "chainweaver://flows/order_status/schema" in text
    # The exact arguments, in a labelled user-data section after the notice.
    arguments = result.meta["chainweaver"]["arguments"]
    assert arguments == {"order_id": "A-77"}
    assert result.meta["chainweaver"]["tool"] == "order_status"
    section = f'<user-data name="arguments">{json.dumps(arguments, indent=2)}</user-data>'
    assert text.endswith(f"{NOTICE}\n{section}")


@pytest.mark.anyio
async def test_schema_defaults_fill_omitted_optional_arguments() -> None:
    async with Client(prompting().fastmcp) as client:
        result = await client.get_prompt("product_search", {"query": "lamp", "sort": "price"})
    assert result.meta["chainweaver"]["arguments"] == {
        "query": "lamp", "limit": 5, "sort": "price", "in_stock": False}
    # Without expose_schemas there is no schema resource to point at.
    assert "chainweaver://" not in text_of(result)


@pytest.mark.anyio
async def test_safety_lines_follow_the_flow_safety() -> None:
    server = prompting(
        policy=ExposurePolicy(
            allow_requires_approval=True,
            allowed_side_effects=["none", "read", "write"],
            force_expose=True,
            flow_names=["needs_approval", "write_flow", "unknown_safety"],
        ),
    )
    async with Client(server.fastmcp) as client:
        texts = {name: text_of(await client.get_prompt(name, {"query": "q"}))
                 for name in ("needs_approval", "write_flow", "unknown_safety")}
        guide = text_of(await client.get_prompt(GUIDE))
    assert "Approval: required (reads personal data)." in texts["needs_approval"]
    assert "Safety: NOT read-only. Its side effects are 'write'." in texts["write_flow"]
    assert texts["unknown_safety"].count("Safety: unknown.") == 1
    assert "- `write_flow` (Write Flow; side effects: write): Writes." in guide
    assert "(Needs Approval; read-only, needs approval)" in guide
    assert "(Unknown Safety; safety unknown)" in guide


@pytest.mark.anyio
async def test_missing_unknown_and_non_string_arguments_are_invalid_params() -> None:
    async with Client(prompting().fastmcp) as client:
        missing = await prompt_error(client, "order_status", {})
        unknown = await prompt_error(client, "order_status", {"order_id": "A-1", "color": "x"})
        authored = await prompt_error(client, "product_search__compare", {"first": "a"})
        authored_unknown = await prompt_error(client, "product_search__compare",
                                              {"first": "a", "second": "b", "third": "c"})
        guide = await prompt_error(client, GUIDE, {"flow": "x"})
        # The JSON-RPC params carry a number where MCP requires a string.
        number = await raw_prompt_error(client, "product_search", {"query": "q", "limit": 5})
    assert missing.model_dump() == invalid("order_status", "missing required argument 'order_id'")
    assert unknown.model_dump() == invalid("order_status", "unknown argument 'color'")
    assert authored.model_dump() == invalid("product_search__compare",
                                            "missing required argument 'second'")
    assert authored_unknown.model_dump() == invalid("product_search__compare",
                                                    "unknown argument 'third'")
    assert guide.model_dump() == invalid(GUIDE, "unknown argument 'flow'")
    assert number.model_dump() == invalid(
        "product_search", "argument 'limit' must be a string, got number")


@pytest.mark.anyio
async def test_a_version_other_than_the_exposed_one_is_unknown() -> None:
    async with Client(prompting().fastmcp) as client:
        ok = await client.get_prompt("order_status", {"order_id": "A-1"}, version="2.1.0")
        with pytest.raises(MCPError) as older:
            await client.get_prompt("order_status", {"order_id": "A-1"}, version="1.9.0")
    assert ok.meta["chainweaver"]["arguments"] == {"order_id": "A-1"}
    assert older.value.error.message == "Unknown prompt: 'order_status'"


# -------------------------------------------------------------- acceptance



@pytest.mark.anyio
async def test_acceptance_required_arguments_render_valid_tool_arguments_that_call() -> None:
    await assert_acceptance(prompting(expose_schemas=True))


# ------------------------------------------------------- server-level prompts


OPERATOR_COMPARE = FlowPrompt(
    "product_search__compare", title="Operator comparison",
    arguments=[PromptArgument("items", "What to compare", required=True)],
    messages=[PromptMessage("assistant", "Comparing {{ items }} the operator's way.")],
)
TRIAGE = FlowPrompt("triage", description="Pick a flow for a request.",
                    messages=[PromptMessage("user", "Which flow fits this request?")])


@pytest.mark.anyio
async def test_server_level_prompts_are_published_and_override_flow_prompts() -> None:
    server = prompting(prompts=[TRIAGE, OPERATOR_COMPARE])
    async with Client(server.fastmcp) as client:
        prompts = {p.name: p for p in await client.list_prompts()}
        compare = await client.get_prompt("product_search__compare", {"items": "a, b"})
        triage = await client.get_prompt("triage")
        old_arguments = await prompt_error(client, "product_search__compare",
                                           {"first": "a", "second": "b"})
    assert published_meta(prompts["triage"]) == {"server_prompt": True}
    assert prompts["product_search__compare"].title == "Operator comparison"
    assert published_meta(prompts["product_search__compare"]) == {"server_prompt": True}
    assert [m.role for m in compare.messages] == ["assistant"]
    assert text_of(compare).startswith('Comparing <user-data name="items">a, b</user-data>')
    assert text_of(triage) == "Which flow fits this request?"
    assert old_arguments.model_dump() == invalid("product_search__compare",
                                                 "unknown argument 'first'")
    report = {e.flow_name: e for e in server.exposure_report()}
    assert report["product_search"].overridden_prompts == ("product_search__compare",)
    assert report["product_search"].prompt_names == ("product_search", "product_search__brief")
    assert report["product_search"].to_dict()["overridden_prompts"] == [
        "product_search__compare"]
    assert "triage" in server.prompt_names


@pytest.mark.anyio
async def test_a_server_prompt_can_take_over_an_invocation_prompt_and_the_guide() -> None:
    takeover = FlowPrompt("order_status", messages=[PromptMessage("user", "Ask support.")])
    guide = FlowPrompt(GUIDE, messages=[PromptMessage("user", "Our own guide.")])
    server = prompting(prompts=[takeover, guide])
    async with Client(server.fastmcp) as client:
        assert text_of(await client.get_prompt("order_status")) == "Ask support."
        assert text_of(await client.get_prompt(GUIDE)) == "Our own guide."
        index_names = [p.name for p in await client.list_prompts()]
    assert index_names.count("order_status") == 1 and index_names.count(GUIDE) == 1
    report = {e.flow_name: e for e in server.exposure_report()}
    assert report["order_status"].overridden_prompts == ("order_status",)
    assert report["order_status"].prompt_names == ()


def test_prompt_configuration_mistakes_fail_at_construction() -> None:
    with pytest.raises(ExposureConfigError, match="expose_prompts"):
        FlowServer(build_catalogue(), prompts=[TRIAGE])
    with pytest.raises(ExposureConfigError, match="FlowPrompt"):
        FlowServer(build_catalogue(), expose_prompts=True, prompts=["triage"])
    with pytest.raises(ExposureConfigError, match="unique"):
        FlowServer(build_catalogue(), expose_prompts=True, prompts=[TRIAGE, TRIAGE])
    executor = build_catalogue()
    # Its invocation prompt would take the name of product_search's authored prompt.
    executor.registry.register_flow(Flow(
        "product_search__compare", "Clashes.", [FlowStep("search_products")]))
    with pytest.raises(ExposureConfigError, match="'product_search__compare'"):
        FlowServer(executor, expose_prompts=True)
    # Without prompts nothing is published under those names, so nothing clashes.
    assert "product_search__compare" in FlowServer(executor).registered_tool_names


# --------------------------------------------------------------------- guide


@pytest.mark.anyio
async def test_the_guide_explains_every_exposed_flow_and_no_excluded_one() -> None:
    async with Client(prompting(expose_schemas=True).fastmcp) as client:
        guide = await client.get_prompt(GUIDE)
        tools = await client.list_tools()
    text = text_of(guide)
    assert "ONE tool call" in text and "prefer read-only flows" in text
    for listed in tools:
        assert (f"- `{listed.name}` ({listed.title}; read-only): {listed.description}"
                in text)
        assert f"  Schema: chainweaver://flows/{listed.name}/schema" in text
        assert f"  Prompt: {listed.name}" in text
    for name in EXCLUDED_NAMES:
        assert name not in text
    for description in ("Draft report.", "Writes.", "Deletes.", "No contract."):
        assert description not in text


@pytest.mark.anyio
async def test_the_guide_of_a_server_publishing_nothing_says_so() -> None:
    server = prompting(policy=ExposurePolicy(allowed_lifecycles=["reviewed"]))
    async with Client(server.fastmcp) as client:
        assert [p.name for p in await client.list_prompts()] == [GUIDE]
        assert text_of(await client.get_prompt(GUIDE)) == (
            "This server publishes no flows right now.")


# ---------------------------------------------------------------- completion




@pytest.mark.anyio
async def test_completion_offers_enum_boolean_and_example_values() -> None:
    async with Client(prompting().fastmcp) as client:
        assert await complete(client, "product_search", "sort") == ["relevance", "price"]
        assert await complete(client, "product_search", "sort", "pr") == ["price"]
        assert await complete(client, "product_search", "in_stock") == ["true", "false"]
        assert await complete(client, "product_search", "query") == ["red shoes"]
        assert await complete(client, "order_status", "order_id", "A-") == ["A-1001"]
        assert await complete(client, "order_status", "order_id", "B") == []
        # Nothing to offer: a free integer, an unknown argument, authored prompts, the guide.
        assert await complete(client, "product_search", "limit") == []
        assert await complete(client, "product_search", "nope") == []
        assert await complete(client, "product_search__compare", "first") == []
        assert await complete(client, GUIDE, "anything") == []
        for name in [*EXCLUDED_NAMES, NEVER]:
            assert await complete(client, name, "query") == []


# ------------------------------------------------------ rendering runs nothing


@pytest.mark.anyio
async def test_no_prompts_get_ever_calls_a_tool_function() -> None:
    server = prompting(
        expose_schemas=True,
        policy=ExposurePolicy(
            allowed_lifecycles=["active", "draft"],
            allowed_side_effects=["none", "read", "write", "destructive"],
        ),
    )
    before = CALLS.copy()
    rendered = 0
    async with Client(server.fastmcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
        for prompt in await client.list_prompts():
            schema = tools[prompt.name].input_schema if prompt.name in tools else None
            values = {a.name: example_for(schema["properties"][a.name]) if schema else "v"
                      for a in prompt.arguments or ()}
            await client.get_prompt(prompt.name, values)
            rendered += 1
            # A failing render must not run anything either.
            with pytest.raises(MCPError):
                await client.get_prompt(prompt.name, {**values, "unexpected": "x"})
    assert rendered == len(server.prompt_names) >= 10
    assert CALLS == before


# ---------------------------------------------------------- gate and audit


SECRET = "zebra-4471-private"


@pytest.mark.anyio
async def test_prompts_get_is_audited_with_a_hash_of_the_rendered_messages() -> None:
    events: list[AuditEvent] = []
    server = prompting(security=SecurityConfig(audit_hook=events.append))
    async with Client(server.fastmcp) as client:
        await client.list_prompts()
        # prompts/list is audited without a flow or a hash
        assert [(e.kind, e.name, e.flow_name, e.result_sha256) for e in events] == [
            ("list", "prompts/list", None, None)] * 2
        events.clear()
        compare = await client.get_prompt("product_search__compare",
                                          {"first": SECRET, "second": "b"})
        guide = await client.get_prompt(GUIDE)
        await prompt_error(client, "order_status", {"order_id": SECRET})
    completed = [e for e in events if e.phase == "completed"]
    assert [(e.name, e.outcome) for e in completed] == [
        ("product_search__compare", "ok"), (GUIDE, "ok"), ("order_status", "error")]
    for event, result in zip(completed[:2], (compare, guide), strict=True):
        data = text_of(result).encode("utf-8")
        assert event.kind == "prompt" and event.decision == "allowed"
        assert event.result_sha256 == hashlib.sha256(data).hexdigest()
        assert event.result_length == len(data)
    assert (completed[0].flow_name, completed[0].flow_version) == ("product_search", "1.0.0")
    assert (completed[1].flow_name, completed[1].flow_version) == (None, None)
    assert completed[2].error_type == "ValidationError" and completed[2].result_sha256 is None
    assert len([e for e in events if e.phase == "decision"]) == 3
    assert not any(SECRET in repr(event) for event in events)


@pytest.mark.anyio
async def test_argument_values_never_reach_logs_above_debug(
    all_logs: pytest.LogCaptureFixture,
) -> None:
    server = prompting(security=SecurityConfig(audit_hook=lambda event: None))
    async with Client(server.fastmcp) as client:
        await client.get_prompt("product_search", {"query": SECRET})
        await client.get_prompt("product_search__brief", {"audience": SECRET})
        for arguments in ({"query": SECRET, "limit": SECRET}, {"query": SECRET, SECRET: "x"},
                          {"query": "q", "sort": SECRET}):
            await prompt_error(client, "product_search", arguments)
        await prompt_error(client, "order_status", {"order_id": f"B-{SECRET}"})
        await raw_prompt_error(client, "product_search", {"query": SECRET, "limit": 7})
    # Formatted with any traceback a record carries (the errors, which quote the
    # values, are logged below DEBUG: tests/mcp/components/test_caller_mistakes_log.py).
    logged = [(r.levelno, logging.Formatter().format(r)) for r in all_logs.records]
    assert [text for level, text in logged if level > logging.DEBUG and SECRET in text] == []
    # FastMCP's DEBUG line for each request quotes its arguments: DEBUG only.
    assert any(SECRET in text for level, text in logged if level == logging.DEBUG)


@pytest.mark.anyio
async def test_the_gate_refuses_prompts_and_hooks_see_kind_prompt() -> None:
    events: list[AuditEvent] = []
    seen: list[GateContext] = []

    def authorize(ctx: GateContext) -> AuthorizationDecision:
        seen.append(ctx)
        return AuthorizationDecision(ctx.name == GUIDE, "prompts_closed")

    server = prompting(security=SecurityConfig(audit_hook=events.append, authorizer=authorize))
    before = CALLS.copy()
    async with Client(server.fastmcp) as client:
        await client.get_prompt(GUIDE)
        with pytest.raises(MCPError) as caught:
            await client.get_prompt("product_search", {"query": SECRET})
        with pytest.raises(MCPError) as excluded:
            await client.get_prompt("write_flow", {"query": "q"})
    assert caught.value.error.model_dump() == {
        "code": -32001, "message": "Request refused: prompts_closed",
        "data": {"reason": "prompts_closed"}}
    # Refused before lookup: an excluded name is refused exactly the same way.
    assert excluded.value.error.model_dump() == caught.value.error.model_dump()
    assert [(c.kind, c.name, c.flow_name) for c in seen] == [
        ("prompt", GUIDE, None), ("prompt", "product_search", "product_search"),
        ("prompt", "write_flow", None)]
    assert not any(SECRET in repr(ctx) for ctx in seen)
    denied = [e for e in events if e.decision == "denied"]
    assert [e.name for e in denied] == ["product_search", "write_flow"]
    assert CALLS == before


def test_the_report_lists_each_flows_prompt_names() -> None:
    server = prompting(expose_schemas=True)
    report = {e.flow_name: e for e in server.exposure_report()}
    assert report["order_status"].prompt_names == ("order_status",)
    assert report["product_search"].prompt_names == (
        "product_search", "product_search__compare", "product_search__brief")
    assert report["draft_report"].prompt_names == () and not report["draft_report"].exposed
    published = {name for entry in report.values() for name in entry.prompt_names}
    assert published | {GUIDE} == set(server.prompt_names)


@pytest.mark.anyio
async def test_prompts_the_server_does_not_own_keep_the_sdk_answer_for_non_strings() -> None:
    server = prompting()
    rendered: list[str] = []

    @server.fastmcp.prompt
    def greet(name: str) -> str:
        rendered.append(name)
        return f"Hello {name}"

    async with Client(server.fastmcp) as client:
        own = await raw_prompt_error(client, "product_search", {"query": 5})
        foreign = await raw_prompt_error(client, "greet", {"name": 5})
        assert text_of(await client.get_prompt("greet", {"name": "Bob"})) == "Hello Bob"
    assert own.model_dump() == invalid("product_search",
                                       "argument 'query' must be a string, got number")
    # Not blanked to "" and rendered: the SDK refuses the request, as without FlowServer.
    assert foreign.code == -32602
    assert rendered == ["Bob"]
