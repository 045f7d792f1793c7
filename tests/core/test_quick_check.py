"""The exposure decision's quick check (chainweaver.quick_check) agrees with the plan
compiler: over generated flows, whatever it shows clean compiles without a problem, to
the same input model; and the flows it is meant for are shown clean."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from chainweaver import (
    Const,
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    ToolSafetyContract,
    tool,
)

READ = ToolSafetyContract("read")
WRITE = ToolSafetyContract("write")


class OutV(BaseModel):
    v: int


class OutW(BaseModel):
    w: int
    v: int | None = None


class InX(BaseModel):
    x: int


class InV(BaseModel):
    v: int
    extra: int = 0


class Result(BaseModel):
    v: int
    w: int


@tool(safety=READ)
def first(x: int, b: int = 0) -> OutV:
    """Needs x."""
    return OutV(v=x + b)


@tool(safety=READ)
def second(v: int) -> OutW:
    """Needs v."""
    return OutW(w=v * 2)


@tool(safety=READ)
def third(w: int = 1, z: int = 0) -> OutV:
    """Needs nothing; returns what ``first`` returns."""
    return OutV(v=w + z)


@tool(safety=WRITE)
def writer(v: int) -> OutW:
    """Not idempotent."""
    return OutW(w=v)


@tool(safety=READ)
def loose(x: int) -> dict:
    """An undeclared output."""
    return {"v": x}


TOOLS = [first, second, third, writer, loose]
# Weighted towards flows that are clean or nearly so: one slip is what the check must see.
NAMES = ["first", "second", "third"] * 3 + ["writer", "loose", "missing", "flow:inner"]
KEYS = ["x", "v", "w", "z", "b"] * 2 + ["nowhere"]
FIELDS = ["x", "b", "v", "w", "z"] * 2 + ["extra", "bogus"]


def _executor() -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    for item in TOOLS:
        executor.register_tool(item)
    executor.registry.register_flow(Flow("inner", "a sub-flow", [FlowStep("first")]))
    return executor


@st.composite
def flows(draw: st.DrawFn) -> Flow:
    count = draw(st.integers(1, 5))
    steps = []
    for i in range(count):
        after = draw(st.one_of(st.none(), st.lists(st.sampled_from(range(i)), unique=True)
                               if i else st.just([])))
        name = draw(st.sampled_from(NAMES))
        mapping: dict[str, Any] = {}
        if draw(st.integers(0, 3)) == 0:
            for field in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=2)):
                mapping[field] = draw(st.sampled_from([*KEYS, Const(3)]))
        on_error = draw(st.sampled_from(["fail", "fail", "fail", "skip", "fallback"]))
        options: dict[str, Any] = {
            "id": f"s{i}", "after": None if after is None else [f"s{j}" for j in after],
            "on_error": on_error,
            "fallback": draw(st.sampled_from(NAMES[:-1])) if on_error == "fallback" else None,
            "retry": RetryPolicy(max_attempts=2) if draw(st.integers(0, 4)) == 0 else None,
            "output_mapping": draw(st.sampled_from(
                [{}, {}, {}, {}, {"v2": "v"}, {"w": "w"}, {"z": "nope"}])),
        }
        if name == "flow:inner":
            steps.append(FlowStep(flow="inner", input_mapping=mapping, **options))
        else:
            steps.append(FlowStep(name, mapping, **options))
    try:
        return Flow("generated", "a generated flow", steps,
                    input_schema=draw(st.sampled_from([None, None, None, InX, InV])),
                    output_schema=draw(st.sampled_from([None, None, None, Result])))
    except DefinitionError:
        assume(False)
        raise


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flow=flows())
def test_a_flow_shown_clean_compiles_without_a_problem(flow: Flow) -> None:
    executor = _executor()
    shown = executor.clean_input_model(flow)
    problems = executor.check_flow(flow)
    if shown is not None:
        assert problems == []
        assert executor.plan(flow).input_model is shown


def _chain(*steps: FlowStep, **options: Any) -> Flow:
    return Flow("chain", "a flow", list(steps), **options)


@pytest.mark.parametrize("flow", [
    _chain(FlowStep("first"), FlowStep("second")),
    _chain(FlowStep("first"), FlowStep("second"), FlowStep("third", {"z": "v"})),
    _chain(FlowStep("first", {"x": "v"}), input_schema=InV),
    _chain(FlowStep("first"), FlowStep("second", on_error="fallback", fallback="writer")),
    _chain(FlowStep("first", retry=RetryPolicy(max_attempts=3)), FlowStep("second")),
    _chain(FlowStep("first"), FlowStep("second", output_mapping={"total": "w"})),
    _chain(FlowStep("first", id="a"),
           FlowStep("third", id="b", after=[], output_mapping={"other": "v"}),
           FlowStep("second", id="c", after=["a", "b"]), output_schema=Result),
], ids=["chain", "mapped", "renamed-input", "fallback", "retry", "output-mapping", "dag"])
def test_the_common_shapes_are_shown_clean(flow: Flow) -> None:
    executor = _executor()
    assert executor.check_flow(flow) == []
    assert executor.clean_input_model(flow) is executor.plan(flow).input_model


@pytest.mark.parametrize("flow", [
    _chain(FlowStep("first"), FlowStep(flow="inner")),  # a sub-flow: compiled
    _chain(FlowStep("first", {"b": Const(2)})),  # a constant: compiled
    _chain(FlowStep("loose"), FlowStep("second")),  # an undeclared output: compiled
    _chain(FlowStep("first"), FlowStep("missing")),
    _chain(FlowStep("first"), FlowStep("second", {"v": "nowhere"})),
    _chain(FlowStep("first"), FlowStep("writer", retry=RetryPolicy(max_attempts=2))),
    _chain(FlowStep("first", id="a"), FlowStep("third", id="b", after=[]),
           output_schema=Result),
], ids=["sub-flow", "constant", "undeclared", "missing-tool", "unfed", "retry-write",
        "output-unfilled"])
def test_other_flows_are_left_to_the_compiler(flow: Flow) -> None:
    assert _executor().clean_input_model(flow) is None
