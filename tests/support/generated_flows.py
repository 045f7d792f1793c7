"""Generated flows over a handful of small tools: clean ones, and ones with one slip
(a missing tool, an unfed field, a retry on a write, a conflicting write, ...). The
exposure decision's quick check is held to the plan compiler over them."""

from __future__ import annotations

from typing import Any

from hypothesis import assume
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


@tool(safety=ToolSafetyContract("read", requires_approval=True, approval_reason="asks"))
def asker(v: int) -> OutW:
    """Needs approval."""
    return OutW(w=v)


TOOLS = [first, second, third, writer, loose, asker]
# Weighted towards flows that are clean or nearly so: one slip is what the check must see.
NAMES = ["first", "second", "third"] * 3 + ["writer", "loose", "missing", "flow:inner"]
KEYS = ["x", "v", "w", "z", "b"] * 2 + ["nowhere"]
FIELDS = ["x", "b", "v", "w", "z"] * 2 + ["extra", "bogus"]


def tool_executor() -> FlowExecutor:
    """An executor with every tool here and the sub-flow ``inner``."""
    executor = FlowExecutor(FlowRegistry())
    for item in TOOLS:
        executor.register_tool(item)
    executor.registry.register_flow(Flow("inner", "a sub-flow", [FlowStep("first")]))
    return executor


@st.composite
def flows(draw: st.DrawFn, names: list[str] = NAMES, name: str = "generated",
          declared: list[Any] | None = None) -> Flow:
    """One flow of 1-5 steps; ``names``: the step tools (``flow:inner``: a sub-flow)."""
    count = draw(st.integers(1, 5))
    tools = [n for n in names if n != "flow:inner"]
    steps = []
    for i in range(count):
        after = draw(st.one_of(st.none(), st.lists(st.sampled_from(range(i)), unique=True)
                               if i else st.just([])))
        step_tool = draw(st.sampled_from(names))
        mapping: dict[str, Any] = {}
        if draw(st.integers(0, 3)) == 0:
            for field in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=2)):
                mapping[field] = draw(st.sampled_from([*KEYS, Const(3)]))
        on_error = draw(st.sampled_from(["fail", "fail", "fail", "skip", "fallback"]))
        options: dict[str, Any] = {
            "id": f"s{i}", "after": None if after is None else [f"s{j}" for j in after],
            "on_error": on_error,
            "fallback": draw(st.sampled_from(tools)) if on_error == "fallback" else None,
            "retry": RetryPolicy(max_attempts=2) if draw(st.integers(0, 4)) == 0 else None,
            "output_mapping": draw(st.sampled_from(
                [{}, {}, {}, {}, {"v2": "v"}, {"w": "w"}, {"z": "nope"}])),
        }
        if step_tool == "flow:inner":
            steps.append(FlowStep(flow="inner", input_mapping=mapping, **options))
        else:
            steps.append(FlowStep(step_tool, mapping, **options))
    try:
        return Flow(name, "a generated flow", steps, safety=draw(st.sampled_from(
                        declared if declared is not None else [None])),
                    input_schema=draw(st.sampled_from([None, None, None, InX, InV])),
                    output_schema=draw(st.sampled_from([None, None, None, Result])))
    except DefinitionError:
        assume(False)
        raise
