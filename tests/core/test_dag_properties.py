"""Property-based tests: both lanes agree on generated DAGs; the ``when`` parser never runs
anything it is given."""

from __future__ import annotations

import ast
import asyncio
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, create_model

from chainweaver import (
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    ToolSafetyContract,
    tool,
)
from chainweaver.conditions import Condition, ConditionError


class Value(BaseModel):
    value: int


@tool(safety=ToolSafetyContract("read"))
def add(a: int = 0, b: int = 0) -> Value:
    """Sync: fails on multiples of 7 so that on_error paths are exercised."""
    if (a + b) % 7 == 6:
        raise ValueError("unlucky")
    return Value(value=a * 2 + b + 1)


@tool(safety=ToolSafetyContract("read"))
async def mix(a: int = 0, b: int = 0) -> Value:
    """Async, with waits of different lengths so that concurrent branches finish (and
    fail) in an order other than plan order."""
    await asyncio.sleep(0.002 * ((a - b) % 3))
    if (a + b) % 5 == 4:
        raise ValueError("unlucky")
    return Value(value=a + 3 * b + 2)


MAX_STEPS = 7
FlowOut = create_model("FlowOut", **{f"v{i}": (int | None, None) for i in range(MAX_STEPS)})
FlowIn = create_model("FlowIn", x=(int, ...))
CONDITIONS = [None, "x > 3", "x in [1, 2, 3]", "{k} is None", "{k} is not None and {k} > 4",
              "not ({k} in [1, 3, 5, 7])", "x <= 2 or {k} == 10"]


@st.composite
def dags(draw: st.DrawFn) -> list[FlowStep]:
    count = draw(st.integers(1, MAX_STEPS))
    steps = []
    for i in range(count):
        earlier = list(range(i))
        after = draw(st.one_of(st.none(), st.lists(st.sampled_from(earlier), unique=True)
                               if earlier else st.just([])))
        deps = ([i - 1] if i else []) if after is None else after
        # inputs come from the flow input or (mostly) an ancestor's output
        ancestors = set(deps)
        for d in deps:
            ancestors |= set(range(d))  # over-approximation is fine: a missing key is data
        keys = ["x"] + [f"v{j}" for j in sorted(ancestors)]
        mapping = {field: draw(st.sampled_from(keys))
                   for field in draw(st.lists(st.sampled_from(["a", "b"]), unique=True))}
        condition = draw(st.sampled_from(CONDITIONS))
        if condition is not None:
            condition = condition.format(k=draw(st.sampled_from(keys)))
        on_error = draw(st.sampled_from(["skip", "skip", "fail", "fallback"]))
        steps.append(FlowStep(
            draw(st.sampled_from(["add", "mix"])), mapping, id=f"s{i}",
            after=None if after is None else [f"s{j}" for j in after],
            when=condition, on_error=on_error,
            fallback=draw(st.sampled_from(["add", "mix"])) if on_error == "fallback" else None,
            retry=draw(st.sampled_from([None, RetryPolicy(2, backoff_seconds=0)])),
            output_mapping={f"v{i}": "value"},
        ))
    return steps


def shape(result) -> tuple:
    records = [(r.step_id, r.status, r.inputs, r.outputs, r.error, r.attempts,
                r.attempt_errors, r.fallback) for r in result.steps]
    error = (result.error.type, result.error.step_id) if result.error else None
    return result.success, result.final_output, error, records


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=dags(), x=st.integers(-3, 12))
def test_both_lanes_give_the_same_output_and_records(steps: list[FlowStep], x: int) -> None:
    registry = FlowRegistry()
    executor = FlowExecutor(registry, max_concurrent_steps=3)
    executor.register_tool(add)
    executor.register_tool(mix)
    registry.register_flow(Flow("g", "", steps, input_schema=FlowIn, output_schema=FlowOut))
    sync = executor.execute_flow("g", {"x": x})
    async_ = asyncio.run(executor.execute_flow_async("g", {"x": x}))
    assert shape(sync) == shape(async_)
    if sync.success:
        assert [r.step_id for r in sync.steps] == [f"s{i}" for i in
                                                    registry.get_flow("g").order]


# ------------------------------------------------------------------ the when parser

ALLOWED_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not,
                 ast.USub, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
                 ast.In, ast.NotIn, ast.Is, ast.IsNot, ast.Name, ast.Load, ast.Constant,
                 ast.List, ast.Tuple)
TOKENS = ["x", "y", "__class__", "__import__", "os", "(", ")", "[", "]", ".", ",", "'a'",
          "1", "-2.5", "None", "True", "and", "or", "not", "in", "is", "==", "<", ">=",
          "!=", "+", "*", "lambda", ":", "if", "else", "for", "f'{x}'", "open", "()", "0",
          "system", "[0]", "**", "~", "@", "b'x'", "1j", "...", "__"]


def _parse_or_reject(text: str) -> Condition | None:
    def forbidden(*args, **kwargs):
        raise AssertionError("the when parser must never eval or exec")

    with mock.patch("builtins.eval", forbidden), mock.patch("builtins.exec", forbidden):
        try:
            return Condition(text)
        except DefinitionError:
            return None


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=60),
                 st.lists(st.sampled_from(TOKENS), max_size=12).map(" ".join)))
def test_junk_is_either_a_safe_condition_or_a_definition_error(text: str) -> None:
    condition = _parse_or_reject(text)
    if condition is None:
        return
    # Accepted: the expression uses nothing outside the allowed grammar...
    for node in ast.walk(ast.parse(text.strip(), mode="eval")):
        assert isinstance(node, ALLOWED_NODES), (text, type(node).__name__)
        if isinstance(node, ast.Name):
            assert not node.id.startswith("__") and not node.id.endswith("__")
    # ...and evaluating it gives a bool or a ConditionError, whatever the context holds.
    for context in ({}, {"x": 1, "y": "a"}, {"x": None, "y": [1]}):
        try:
            assert isinstance(condition.evaluate(context), bool)
        except ConditionError:
            pass


def test_conditions_evaluate_over_context_keys() -> None:
    condition = Condition("status in ('open', 'new') and not (total > 100) or vip == True")
    assert condition.names == ("status", "total", "vip")
    assert condition.evaluate({"status": "open", "total": 5})
    assert not condition.evaluate({"status": "open", "total": 500})
    assert condition.evaluate({"vip": True})
    assert Condition("missing is None").evaluate({})
    assert Condition("-1 < x <= 3").evaluate({"x": 3})


def test_dangerous_conditions_are_definition_errors() -> None:
    for text in ["__import__('os').system('x')", "x.__class__", "open('f')", "x[0]",
                 "(lambda: 1)()", "x + 1 > 2", "x is 3", "__debug__", "[y for y in x]",
                 "f'{x}'", "", "x ==", "a if b else c", "x := 1"]:
        assert _parse_or_reject(text) is None, text
