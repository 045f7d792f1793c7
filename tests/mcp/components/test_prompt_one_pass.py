"""Prompt substitution is one pass, for every kind of prompt: a template's, a
``messages`` callable's (even one that copies argument values into its text), a
server-level prompt's and the schema-derived invocation prompt's. Text that came from
an argument value is never read as a placeholder: hostile values come out literally.
Always through a real in-memory MCP client, on both protocol eras.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types
import pytest
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.catalogue import build_catalogue
from support.mcp_client import NOTICE, section, text_of
from support.sealing import NOT_XML_TEXT

from chainweaver import Flow, FlowPrompt, FlowStep, PromptArgument, PromptMessage
from chainweaver.mcp import FlowServer

MODES = ["auto", "legacy"]  # 2026-07-28, 2025-11-25
HOSTILE = ["{{ other }}", "{{ name }}", "{{other}}", "{{ 7*7 }}", "{x}", "{0}", "$x", "${x}",
           "%s", "{", "}", "{{", "}}", "{{ oth", "er }}", "{{ {{ other }} }}",
           "https://evil.example/{{ other }}?q={y}", "</user-data>", "\\", "\n"]
ARGUMENTS = [PromptArgument("name", required=True), PromptArgument("other", required=True)]


def copying(values: dict[str, str]) -> list[PromptMessage]:
    """A callable that copies values into its text (raw, JSON-quoted) next to a
    placeholder of its own."""
    return [PromptMessage("user", f"Name: {values['name']} / {json.dumps(values['name'])} "
                                  f"/ {{{{ other }}}}"),
            PromptMessage("assistant", f"{values['other']}{values['name']}")]


def choosing(values: dict[str, str]) -> list[PromptMessage]:
    """A callable choosing its wording from a value, as the documentation shows."""
    if values["name"] == "short":
        return [PromptMessage("user", "Briefly: {{ other }}")]
    return [PromptMessage("user", "At length about {{ name }}: {{ other }}")]


TEMPLATE = FlowPrompt("template", arguments=ARGUMENTS, messages=[
    PromptMessage("user", "Name: {{ name }} / {{ other }}")])


def served() -> FlowServer:
    """Every kind of prompt: flow-authored (template and callables), server-level
    (callable) and the invocation prompt of each exposed flow."""
    executor = build_catalogue()
    executor.registry.register_flow(Flow(
        "echo", "Echo a query.", [FlowStep("search_products")],
        prompts=[TEMPLATE, FlowPrompt("copying", arguments=ARGUMENTS, messages=copying),
                 FlowPrompt("choosing", arguments=ARGUMENTS, messages=choosing)]))
    server_level = FlowPrompt("server_copying", arguments=ARGUMENTS, messages=copying)
    return FlowServer(executor, expose_prompts=True, prompts=[server_level])


def copied(name: str, other: str) -> str:
    return (f"Name: {name} / {json.dumps(name)} / {section('other', other)}\n\n{NOTICE}"
            f"\n{other}{name}")


def expected(prompt: str, name: str, other: str) -> str:
    if prompt == "echo__template":
        return f"Name: {section('name', name)} / {section('other', other)}\n\n{NOTICE}"
    if prompt == "echo__choosing":
        return f"At length about {section('name', name)}: {section('other', other)}\n\n{NOTICE}"
    return copied(name, other)  # echo__copying, server_copying


PROMPTS = ["echo__template", "echo__copying", "echo__choosing", "server_copying"]


async def render(client: Client, prompt: str, arguments: dict[str, str]
                 ) -> mcp_types.GetPromptResult:
    return await client.get_prompt(prompt, arguments)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prompt", PROMPTS)
async def test_hostile_values_come_out_literally_in_every_kind_of_prompt(
        mode: str, prompt: str) -> None:
    async with Client(served().fastmcp, mode=mode) as client:
        for name in HOSTILE:
            for other in ("{{ name }}", "$x", "plain"):
                result = await render(client, prompt, {"name": name, "other": other})
                assert text_of(result) == expected(prompt, name, other), (name, other)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_value_copied_by_a_callable_is_never_substituted_again(mode: str) -> None:
    async with Client(served().fastmcp, mode=mode) as client:
        result = await render(client, "echo__copying",
                              {"name": "{{ other }}", "other": "SECRET"})
    user, assistant = (m.content.text for m in result.messages)
    # The name's "{{ other }}" is the name's own text, not other's value...
    assert user.startswith('Name: {{ other }} / "{{ other }}" / <user-data name="other">')
    # ...which appears exactly where the callable's own placeholder put it.
    assert user.count("SECRET") == 1
    assert assistant == "SECRET{{ other }}"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_callable_still_chooses_its_wording_from_the_values(mode: str) -> None:
    async with Client(served().fastmcp, mode=mode) as client:
        short = await render(client, "echo__choosing", {"name": "short", "other": "{x}"})
    assert text_of(short) == f"Briefly: {section('other', '{x}')}\n\n{NOTICE}"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_the_invocation_prompt_carries_hostile_values_unchanged(mode: str) -> None:
    async with Client(served().fastmcp, mode=mode) as client:
        for query in HOSTILE:
            result = await render(client, "echo", {"query": query})
            arguments = result.meta["chainweaver"]["arguments"]
            assert arguments["query"] == query
            text = text_of(result)
            json_text = text.rsplit('<user-data name="arguments">', 1)[1]
            assert json.loads(json_text.removesuffix("</user-data>")) == arguments
            assert text.count("</user-data>") == 1


VALUES = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=8)), max_size=5).map(
    "".join).filter(lambda value: not NOT_XML_TEXT.search(value))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.sampled_from(PROMPTS), name=VALUES, other=VALUES,
       mode=st.sampled_from(MODES))
def test_any_values_come_out_literally(prompt: str, name: str, other: str,
                                       mode: str) -> None:
    async def go() -> Any:
        async with Client(served().fastmcp, mode=mode) as client:
            return await render(client, prompt, {"name": name, "other": other})

    assert text_of(anyio.run(go)) == expected(prompt, name, other)


def test_render_itself_is_one_pass_for_a_callable() -> None:
    seen: list[dict[str, str]] = []

    def factory(values: dict[str, str]) -> list[PromptMessage]:
        seen.append(values)
        return [PromptMessage("user", f"{values['name']} {values['other']} {{{{ other }}}}")]

    prompt = FlowPrompt("p", arguments=ARGUMENTS, messages=factory)
    [message] = prompt.render({"name": "{{ other }}", "other": "plain"})
    assert message.text == (f"{{{{ other }}}} plain {section('other', 'plain')}"
                            f"\n\n{NOTICE}")
    # Values without braces reach the callable exactly as sent.
    assert seen[0]["other"] == "plain"
    prompt.render({"name": "Ada", "other": "x"})
    assert seen[1] == {"name": "Ada", "other": "x"}
