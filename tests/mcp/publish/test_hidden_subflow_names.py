"""A flow that starts with a sub-flow takes the sub-flow's input model as its own. When
the sub-flow's first step feeds a field with a constant, a pointer or a rename, that
model is derived for the sub-flow; it used to keep the sub-flow's name (its schema's
``title``, and the names of the nested models a pointer makes), so a visible flow
published the name of a sub-flow its callers cannot see. What a flow publishes is now
named after the flow itself, at any depth of sub-flows.

The test is indistinguishability: two servers that differ only in the name of a
sub-flow the caller cannot see publish exactly the same thing for the visible flow.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastmcp import Client
from pydantic import BaseModel

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mappings import Const, Pointer
from chainweaver.mcp import FlowServer, SecurityConfig

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
HIDDEN = ("payroll_secret_adjust", "zz_other_name")


class Total(BaseModel):
    total: int


@tool(safety=ToolSafetyContract("read"))
def add_fee(amount: int, fee: int) -> Total:
    """Adds a fee."""
    return Total(total=amount + fee)


def served(hidden: str, hide_by: str, feed: Any, *, middle: bool = False) -> FlowServer:
    """``public_total`` (visible) starts with ``hidden`` (outside every view, or opted
    out), or with ``public_middle`` (visible) that starts with it; ``hidden``'s first
    step feeds ``fee`` with ``feed`` (a constant or a pointer)."""
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(add_fee)
    governance = FlowGovernance(publish=False) if hide_by == "opt_out" else FlowGovernance()
    executor.registry.register_flow(Flow(
        hidden, "an internal adjustment", [FlowStep("add_fee", {"fee": feed})],
        governance=governance))
    first = hidden
    if middle:
        executor.registry.register_flow(Flow(
            "public_middle", "adds the fee, visibly", [FlowStep(flow=hidden)]))
        first = "public_middle"
    executor.registry.register_flow(Flow(
        "public_total", "adds the fee", [FlowStep(flow=first)]))

    def visible(caller: Any, flow: Flow) -> bool:
        return flow.name != hidden

    return FlowServer(executor, expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(visible=visible if hide_by == "view" else None))


async def published(server: FlowServer, mode: str, arguments: dict[str, Any]
                    ) -> dict[str, Any]:
    """What a client is told about the visible flows (without the server's random
    owner mark): listing, schema resources, index, prompt, a call's step ids, and the
    answer to arguments of the wrong type."""
    async with Client(server.fastmcp, mode=mode) as client:
        tools = [t.model_dump(mode="json") for t in await client.list_tools()]
        for entry in tools:
            entry["meta"]["chainweaver"].pop("server")
        schemas = [(await client.read_resource(f"chainweaver://flows/{entry['name']}/schema")
                    )[0].text for entry in tools]
        index = (await client.read_resource("chainweaver://flows"))[0].text
        prompt = await client.get_prompt(
            "public_total", {key: json.dumps(value) for key, value in arguments.items()})
        result = await client.call_tool("public_total", arguments)
        wrong = await client.call_tool("public_total", {**arguments, "amount": "many"},
                                       raise_on_error=False)
    return {"tools": tools, "schemas": schemas, "index": index,
            "prompt": [m.content.text for m in prompt.messages],
            "steps": [s["id"] for s in result.meta["chainweaver"]["steps"]],
            "wrong": [part.text for part in wrong.content]}


@pytest.mark.parametrize("hide_by", ["view", "opt_out"])
@pytest.mark.parametrize("mode", ERAS)
async def test_a_flow_starting_with_a_hidden_sub_flow_publishes_nothing_of_its_name(
        mode: str, hide_by: str) -> None:
    first = await published(served(HIDDEN[0], hide_by, Const(3)), mode, {"amount": 1})
    second = await published(served(HIDDEN[1], hide_by, Const(3)), mode, {"amount": 1})
    assert first["steps"] == ["subflow#0"]
    assert [entry["name"] for entry in first["tools"]] == ["public_total"]
    schema = first["tools"][0]["input_schema"]
    assert schema["title"] == "PublicTotalInput"  # named after the flow that publishes it
    assert list(schema["properties"]) == ["amount"]  # the fee is fed inside: not asked
    assert "Invalid arguments for 'public_total'" in first["wrong"][0]
    assert "PayrollSecret" not in json.dumps(first)
    assert first == second


@pytest.mark.parametrize("mode", ERAS)
async def test_nested_models_a_hidden_sub_flows_pointer_makes_are_named_after_the_flow(
        mode: str) -> None:
    # The pointer makes the caller give {"order": {"fee": ...}}: a nested model.
    feed = Pointer("/order/fee")
    arguments = {"amount": 1, "order": {"fee": 2}}
    first = await published(served(HIDDEN[0], "view", feed), mode, arguments)
    second = await published(served(HIDDEN[1], "view", feed), mode, arguments)
    schema = first["tools"][0]["input_schema"]
    assert schema["title"] == "PublicTotalInput"
    assert set(schema["properties"]) == {"amount", "order"}
    assert all(name.startswith("PublicTotalInput") for name in schema.get("$defs", {}))
    assert "PayrollSecret" not in json.dumps(first)
    assert first == second


@pytest.mark.parametrize("mode", ERAS)
async def test_every_visible_flow_above_a_hidden_one_names_its_input_after_itself(
        mode: str) -> None:
    first = await published(served(HIDDEN[0], "view", Const(3), middle=True), mode,
                            {"amount": 1})
    second = await published(served(HIDDEN[1], "view", Const(3), middle=True), mode,
                             {"amount": 1})
    titles = {entry["name"]: entry["input_schema"]["title"] for entry in first["tools"]}
    assert titles == {"public_middle": "PublicMiddleInput",
                      "public_total": "PublicTotalInput"}
    assert "PayrollSecret" not in json.dumps(first)
    assert first == second
