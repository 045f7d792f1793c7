"""Bad input never becomes an internal error, and the audit never claims a reply that
was not sent: prompt argument conversion at its limits, Unicode that cannot be sent,
authorizer answers that are not an explicit yes, unparseable requested versions.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import pytest
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import MCPError
from pydantic import BaseModel, computed_field, field_serializer, field_validator
from support.catalogue import CALLS, build_catalogue
from support.mcp_client import prompt_error

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowPrompt,
    FlowRegistry,
    FlowStep,
    PromptArgument,
    PromptMessage,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    AuthorizationDecision,
    FlowServer,
    SecurityConfig,
)

PROPERTIES = settings(max_examples=60, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


class Nested(BaseModel):
    tree: dict[str, Any]
    tags: list[str] = []
    count: int = 1
    anything: int | str | None = None


@tool(safety=ToolSafetyContract("read"))
def inspect_tree(data: Nested) -> dict:
    """Describe a tree."""
    CALLS["inspect_tree"] += 1
    return {"keys": sorted(data.tree)}


@tool(safety=ToolSafetyContract("read"))
def echo_broken(text: str) -> dict:
    """Echo the text with a lone surrogate appended, which no transport can send."""
    return {"text": text + "\ud800"}


def server(events: list[AuditEvent] | None = None) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    for each in (inspect_tree, echo_broken):
        executor.register_tool(each)
        executor.registry.register_flow(Flow(each.name, "Test flow.", [FlowStep(each.name)]))
    audit = SecurityConfig(audit_hook=events.append) if events is not None else None
    return FlowServer(executor, expose_prompts=True, security=audit)


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.anyio
@pytest.mark.parametrize(("arguments", "detail"), [
    ({"tree": nested(100_000)}, "argument 'tree' must be JSON text (object): nested more "
                                "than 64 levels deep"),
    ({"tree": nested(65)}, "argument 'tree' must be JSON text (object): nested more than "
                           "64 levels deep"),
    ({"tree": "{}", "tags": "[" * 50_000}, "argument 'tags' must be JSON text (array): "
                                          "nested more than 64 levels deep"),
    ({"tree": "{}", "count": "9" * 5_000}, "argument 'count' must be an integer"),
    ({"tree": '{"a": "\\ud800"}'}, "argument 'tree' is not valid Unicode text"),
    ({"tree": "{}", "tags": '["\\udfff"]'}, "argument 'tags' is not valid Unicode text"),
    ({"tree": "{}", "anything": "\ud800"}, "argument 'anything' is not valid Unicode text"),
])
async def test_conversion_at_its_limits_is_invalid_params_naming_the_argument(
    arguments: dict[str, str], detail: str,
) -> None:
    events: list[AuditEvent] = []
    async with Client(server(events).fastmcp) as client:
        error = await prompt_error(client, "inspect_tree", arguments)
        assert (await client.get_prompt("inspect_tree", {"tree": "{}"})).messages
    assert error.model_dump() == {"code": -32602, "message": f"Prompt 'inspect_tree': {detail}",
                                  "data": None}
    completed = [e.outcome for e in events if e.phase == "completed"]
    assert completed == ["error", "ok"]


@pytest.mark.anyio
async def test_the_deepest_accepted_json_renders_and_huge_numbers_stay_text() -> None:
    async with Client(server().fastmcp) as client:
        deep = await client.get_prompt("inspect_tree", {"tree": nested(64)})
        union = await client.get_prompt("inspect_tree", {"tree": "{}",
                                                          "anything": "1" + "0" * 5_000})
    assert deep.meta["chainweaver"]["arguments"]["tree"]["a"]["a"]
    assert union.meta["chainweaver"]["arguments"]["anything"] == "1" + "0" * 5_000


@PROPERTIES
@given(text=st.text(max_size=300) | st.sampled_from(["[" * 70, "{" * 70, '"\\ud800"', "1e999",
                                                      "NaN", "-Infinity", "9" * 5000]))
def test_any_text_in_any_argument_is_rendered_or_refused_with_invalid_params(text: str) -> None:
    async def go() -> None:
        async with Client(server().fastmcp) as client:
            for name in ("tree", "tags", "count", "anything"):
                arguments = {"tree": "{}", name: text}
                try:
                    result = await client.get_prompt("inspect_tree", arguments)
                except MCPError as error:
                    assert error.error.code == -32602, error.error
                    assert error.error.message.startswith(
                        f"Prompt 'inspect_tree': argument '{name}'"), error.error.message
                else:
                    json.dumps(result.meta["chainweaver"]["arguments"]).encode("utf-8")

    anyio.run(go)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_output_that_cannot_be_sent_is_an_error_result_not_an_internal_error(
    mode: str,
) -> None:
    events: list[AuditEvent] = []
    async with Client(server(events).fastmcp, mode=mode) as client:
        result = await client.call_tool("echo_broken", {"text": "a"}, raise_on_error=False)
        assert result.is_error
        assert result.content[0].text.startswith("OutputSerializationError: ")
        assert (await client.call_tool("inspect_tree", {"tree": {}})).content[0].text == (
            '{"keys": []}')
    outcomes = [(e.name, e.outcome) for e in events
                if e.phase == "completed" and e.kind == "tool"]
    assert outcomes == [("echo_broken", "error"), ("inspect_tree", "ok")]


# ------------------------------------------------------------------ authorizer


@pytest.mark.anyio
@pytest.mark.parametrize("answer", [1, "yes", "True", [True], {"allowed": True}, None,
                                    False, object()])
async def test_only_an_explicit_yes_allows(answer: Any) -> None:
    server_ = FlowServer(build_catalogue(), security=SecurityConfig(authorizer=lambda c: answer))
    before = CALLS.copy()
    async with Client(server_.fastmcp) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("price_quote", {"sku": "SKU-1"})
    assert refused.value.error.code == GATE_REFUSED
    assert CALLS == before


@pytest.mark.parametrize("allowed", [1, "yes", None, 0])
def test_a_decision_must_be_built_from_a_bool(allowed: Any) -> None:
    with pytest.raises(TypeError, match="allowed must be True or False"):
        AuthorizationDecision(allowed)


@pytest.mark.parametrize("reason", ["", "has spaces", "line\nbreak", "x" * 65, 5])
def test_a_decision_reason_is_a_short_code(reason: Any) -> None:
    with pytest.raises(TypeError, match="reason must be a short code"):
        AuthorizationDecision(False, reason)


@pytest.mark.anyio
async def test_a_rate_limiter_must_answer_true_to_admit() -> None:
    class Truthy:
        def acquire(self, caller: Any, name: str) -> Any:
            return "yes"

    server_ = FlowServer(build_catalogue(), security=SecurityConfig(rate_limiter=Truthy()))
    async with Client(server_.fastmcp) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("price_quote", {"sku": "SKU-1"})
    assert refused.value.error.data == {"reason": "rate_limited"}


# -------------------------------------------------------------------- versions


@pytest.mark.anyio
@pytest.mark.parametrize("version", ["not a version", "1..0", "v", "x" * 500, "2.1.0+",
                                     "=2.1.0", ">=2.0", "2.1.0 2.1.0"])
async def test_an_unparseable_version_is_not_found_without_log_noise(
    version: str, all_logs: pytest.LogCaptureFixture,
) -> None:
    served = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    all_logs.clear()
    async with Client(served.fastmcp) as client:
        called = await client.call_tool("order_status", {"order_id": "A-1"}, version=version,
                                        raise_on_error=False)
        assert called.is_error and called.content[0].text == "Unknown tool: 'order_status'"
        with pytest.raises(MCPError) as read:
            await client.read_resource("chainweaver://flows/order_status/schema",
                                       version=version)
        assert read.value.error.code == -32602
        with pytest.raises(MCPError, match="Unknown prompt"):
            await client.get_prompt("order_status", {"order_id": "A-1"}, version=version)
    noisy = [r for r in all_logs.records if r.levelno >= logging.WARNING
             and not r.getMessage().startswith("flow ")]  # exposure report lines
    assert noisy == []



# ------------------------------------------------- found by the adversarial review


class Checked(BaseModel):
    key: str = "k"
    amount: int = 1

    @field_validator("key")
    @classmethod
    def no_boom(cls, value: str) -> str:
        if value == "boom":
            raise TypeError("secret-internal-detail")
        return value


@tool(safety=ToolSafetyContract("read"))
def checked(data: Checked) -> dict:
    """Echo the key."""
    CALLS["checked"] += 1
    return {"key": data.key}


def checked_server() -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(checked)
    executor.registry.register_flow(Flow("checked", "Checked.", [FlowStep("checked")]))
    return FlowServer(executor, expose_prompts=True,
                      prompts=(p for p in [FlowPrompt(
                          "note", arguments=[PromptArgument("text")],
                          messages=[PromptMessage("user", "Note: {{ text }}")])]))


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "arguments", "detail"), [
    ("checked", {"key": "boom"}, "the flow's input model refused the arguments"),
    ("checked", {"amount": "1_000"}, "argument 'amount' must be an integer"),
    ("checked", {"amount": "\u0661\u0662"}, "argument 'amount' must be an integer"),
    ("note", {"text": "a\x01b"}, "argument 'text' contains the control character U+0001"),
    ("note", {"text": "\ufffe"}, "argument 'text' contains the control character U+FFFE"),
])
async def test_caller_values_the_model_or_xml_cannot_take_are_invalid_params(
    name: str, arguments: dict[str, str], detail: str, all_logs: pytest.LogCaptureFixture,
) -> None:
    async with Client(checked_server().fastmcp) as client:
        error = await prompt_error(client, name, arguments)
    assert error.model_dump() == {"code": -32602, "message": f"Prompt {name!r}: {detail}",
                                  "data": None}
    assert "secret-internal-detail" not in all_logs.text
    assert not [r for r in all_logs.records if r.levelno >= logging.ERROR]


def test_server_prompts_may_come_from_any_iterable() -> None:
    assert "note" in checked_server().prompt_names  # a generator is read once, not lost


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_lone_surrogate_in_tool_arguments_is_refused_before_the_flow_runs(
    mode: str,
) -> None:
    before = CALLS.copy()
    async with Client(checked_server().fastmcp, mode=mode) as client:
        result = await client.call_tool("checked", {"key": "\ud800"}, raise_on_error=False)
    assert result.is_error
    assert result.content[0].text == "Invalid arguments for 'checked': text must be valid Unicode"
    assert CALLS == before


class Loose(BaseModel):
    needed: str
    bad_default: int = None  # type: ignore[assignment]  # pydantic never checks defaults
    good_default: int = 3


@tool(safety=ToolSafetyContract("read"))
def loose(data: Loose) -> dict:
    """Echo."""
    return {"needed": data.needed}


class Shown(BaseModel):
    model_config = {"extra": "forbid"}
    count: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def doubled(self) -> int:
        return self.count * 2

    @field_serializer("count")
    def count_as_text(self, value: int) -> str:
        return str(value)


@tool(safety=ToolSafetyContract("read"))
def shown(count: int) -> Shown:
    """Count."""
    return Shown(count=count)


@pytest.mark.anyio
async def test_only_defaults_the_model_accepts_fill_omitted_prompt_arguments() -> None:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(loose)
    executor.registry.register_flow(Flow("loose", "Loose.", [FlowStep("loose")]))
    async with Client(FlowServer(executor, expose_prompts=True).fastmcp) as client:
        rendered = await client.get_prompt("loose", {"needed": "x"})
        arguments = rendered.meta["chainweaver"]["arguments"]
        # The invalid default is left out rather than failing the render.
        assert arguments == {"needed": "x", "good_default": 3}


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_output_schema_describes_the_serialised_result(mode: str) -> None:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(shown)
    executor.registry.register_flow(Flow("shown", "Shown.", [FlowStep("shown")]))
    async with Client(FlowServer(executor).fastmcp, mode=mode) as client:
        (listed,) = await client.list_tools()
        result = await client.call_tool("shown", {"count": 2})  # the client checks it
    assert result.structured_content == {"count": "2", "doubled": 4}
    assert listed.output_schema["properties"]["count"]["type"] == "string"
