"""The exposure decision's quick check (chainweaver.mapping_checks.clean_input_model)
agrees with the plan compiler: over generated flows, whatever it shows clean compiles
without a problem, to the same input model; and the flows it is meant for are shown
clean."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from support.generated_flows import InV, Result, flows, tool_executor

from chainweaver import Const, Flow, FlowStep, RetryPolicy, Tool


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flow=flows())
def test_a_flow_shown_clean_compiles_without_a_problem(flow: Flow) -> None:
    executor = tool_executor()
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
    executor = tool_executor()
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
    # Step grants: the plan says what a caller must hold (views and the report read it).
    _chain(FlowStep("first", requires=["orders:read"]), FlowStep("second")),
    _chain(FlowStep("first"), FlowStep("second"), requires=["orders:read"]),
], ids=["sub-flow", "constant", "undeclared", "missing-tool", "unfed", "retry-write",
        "output-unfilled", "step-grant", "flow-grant"])
def test_other_flows_are_left_to_the_compiler(flow: Flow) -> None:
    assert tool_executor().clean_input_model(flow) is None


def test_a_flow_whose_tool_declares_a_grant_is_left_to_the_compiler() -> None:
    executor = tool_executor()
    flow = _chain(FlowStep("first"), FlowStep("second"))
    assert executor.clean_input_model(flow) is not None
    second = executor.get_tool("second")
    granted = Tool("granted", "second, behind a grant", second.input_schema,
                   second.output_schema, second.fn, second.safety, requires=["orders:write"])
    executor.register_tool(granted)
    flow = _chain(FlowStep("first"), FlowStep("granted"))
    assert executor.clean_input_model(flow) is None
    assert executor.plan(flow).required is not None
