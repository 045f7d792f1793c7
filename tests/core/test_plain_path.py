"""The engine's plain path (issue 36, item 3): a flow of plain steps runs in one tight
loop, and gives exactly the results and records the general step runner gives.

A random flow of small tools (some failing, some returning the wrong shape, some
skipped by a condition, some writing through an output mapping, each tool blocking or
not) runs through every path the lanes have: the tight loop (``execute_flow`` and
``execute_flow_async`` with nothing watching), one plain step at a time (an observer
watching), and the general step runner (a generator per step; reached here through the
lanes' ``stop`` argument, which only the lanes pass). Everything but timings must agree.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, field_serializer, field_validator

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, Tool
from chainweaver.engine.calling import Stop
from chainweaver.run_events import RunObserver


class X(BaseModel):
    x: int


class XY(BaseModel):
    x: int
    y: int = 0


class Y(BaseModel):
    y: int


def inc(model: X) -> dict:
    return {"x": model.x + 1}


def double(model: X) -> dict:
    return {"y": model.x * 2}


def add(model: XY) -> dict:
    return {"x": model.x + model.y}


def fail_big(model: X) -> dict:
    if model.x > 20:
        raise ValueError("too big")
    return {"x": model.x}


def odd_bad(model: X) -> dict:
    return {"x": "not a number"} if model.x % 2 else {"x": model.x // 2}


FUNCTIONS = {"inc": (X, X, inc), "double": (X, Y, double), "add": (XY, X, add),
             "fail_big": (X, X, fail_big), "odd_bad": (X, X, odd_bad)}


def executor_for(steps: list[FlowStep], blocking: dict[str, bool]) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    for name, (given_model, returned, fn) in FUNCTIONS.items():
        executor.register_tool(Tool(name, name, given_model, returned, fn,
                                    blocking=blocking[name]))
    executor.registry.register_flow(Flow("random", "A random flow.", steps,
                                         input_schema=XY))
    return executor


step_kinds = st.sampled_from(["plain", "mapped", "when", "skip"])


@st.composite
def flows(draw: Any) -> tuple[list[FlowStep], dict[str, bool]]:
    count = draw(st.integers(1, 5))
    steps = []
    for index in range(count):
        name = draw(st.sampled_from(sorted(FUNCTIONS)))
        kind = draw(step_kinds)
        keywords: dict[str, Any] = {"id": f"s{index}"}
        if kind == "mapped" and FUNCTIONS[name][1] is X:
            keywords["output_mapping"] = {"x": "x", f"x{index}": "x"}
        elif kind == "when":
            keywords["when"] = "x > 3"
        elif kind == "skip":
            keywords["on_error"] = "skip"
        steps.append(FlowStep(name, **keywords))
    blocking = {name: draw(st.booleans()) for name in FUNCTIONS}
    return steps, blocking


class Quiet(RunObserver):
    """Watches and does nothing: the run goes one plain step at a time."""


def comparable(result: Any) -> Any:
    steps = [dataclasses.replace(record, duration_ms=0.0, started_ms=0.0)
             for record in result.steps]
    return dataclasses.replace(result, steps=steps, duration_ms=0.0)


def every_path(executor: FlowExecutor, data: dict[str, Any]) -> dict[str, Any]:
    plan = executor.plan(executor.registry.get_flow("random"))
    lanes = executor._lanes
    results = {
        "tight sync": executor.execute_flow("random", data),
        "stepwise sync": executor.execute_flow("random", data, observer=Quiet()),
        "general sync": lanes.run_sync(plan, data, Stop()),
        "tight async": asyncio.run(executor.execute_flow_async("random", data)),
        "stepwise async": asyncio.run(executor.execute_flow_async("random", data,
                                                                   observer=Quiet())),
    }
    return {path: comparable(result) for path, result in results.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flows(), st.one_of(st.integers(-5, 30), st.just("not a number")), st.integers(0, 3))
def test_plain_and_general_paths_give_identical_results_and_records(
        flow: tuple[list[FlowStep], dict[str, bool]], x: Any, y: int) -> None:
    steps, blocking = flow
    executor = executor_for(steps, blocking)
    results = every_path(executor, {"x": x, "y": y})
    general = results["general sync"]
    for path, result in results.items():
        assert result == general, path


def test_a_flow_of_plain_steps_is_planned_as_one_tight_loop() -> None:
    steps = [FlowStep("inc", id="a"), FlowStep("inc", id="b"), FlowStep("double", id="c")]
    executor = executor_for(steps, dict.fromkeys(FUNCTIONS, True))
    plan = executor.plan(executor.registry.get_flow("random"))
    assert plan.plain
    assert plan.steps[0].reuses_input is False  # XY is the flow's model, X the tool's
    conditional = executor_for([FlowStep("inc", id="a"), FlowStep("inc", id="b", when="x > 1")],
                               dict.fromkeys(FUNCTIONS, True))
    assert not conditional.plan(conditional.registry.get_flow("random")).plain
    mixed = executor_for([FlowStep("inc"), FlowStep("double")],
                         {**dict.fromkeys(FUNCTIONS, True), "double": False})
    assert not mixed.plan(mixed.registry.get_flow("random")).plain  # thread, then loop


# ------------------------------------------------------- reusing the validated input


class Shout(BaseModel):
    text: str

    @field_validator("text")
    @classmethod
    def exclaim(cls, value: str) -> str:
        return value + "!"  # not idempotent: validating its own output changes it


seen: list[Any] = []


def echo(model: Shout) -> dict:
    seen.append(model)
    return {"text": model.text}


def shout_executor(**flow: Any) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(Tool("echo", "Echo.", Shout, None, echo))
    executor.registry.register_flow(Flow("shout", "Shout.", [FlowStep("echo", **flow)]))
    return executor


@pytest.mark.parametrize("observer", [None, Quiet()])
def test_a_first_step_taking_the_flows_input_model_gets_the_validated_input(
        observer: RunObserver | None) -> None:
    seen.clear()
    executor = shout_executor()
    result = executor.execute_flow("shout", {"text": "hi"}, observer=observer)
    # Validated once (as a hand-written caller would), not once more for the step.
    assert result.final_output == {"text": "hi!"}
    assert asyncio.run(executor.execute_flow_async("shout", {"text": "hi"})
                       ).final_output == {"text": "hi!"}
    assert result.steps[0].inputs == {"text": "hi!"}


def test_a_callers_own_model_instance_is_never_handed_to_a_tool() -> None:
    seen.clear()
    executor = shout_executor()
    mine = Shout(text="hi")  # "hi!" already
    result = executor.execute_flow("shout", mine)
    assert seen[0] is not mine  # validated afresh from the context: the tool's own copy
    assert result.final_output == {"text": "hi!!"}


def test_a_mapped_first_step_validates_its_own_input() -> None:
    seen.clear()
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(Tool("echo", "Echo.", Shout, None, echo))

    class Said(BaseModel):
        said: str

    executor.registry.register_flow(Flow("shout", "Shout.",
                                         [FlowStep("echo", {"text": "said"})],
                                         input_schema=Said))
    assert executor.execute_flow("shout", {"said": "hi"}).final_output == {"text": "hi!"}


# ----------------------------------------------- outputs the plan's validator checks


class Stamped(BaseModel):
    x: int

    @field_serializer("x")
    def refuse(self, value: int) -> int:
        if value > 10:
            raise RuntimeError("cannot serialise")
        return value


class Loud(X):
    extra: str = "loud"  # a subclass: its data is validated, the extra field dropped


def stamped_executor(fn: Any) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(Tool("stamp", "Stamp.", X, Stamped, fn))
    executor.register_tool(Tool("loud", "Loud.", X, X, lambda m: Loud(x=m.x)))
    executor.registry.register_flow(Flow("random", "Stamp.", [
        FlowStep("loud", id="s0"), FlowStep("stamp", id="s1")], input_schema=XY))
    return executor


@pytest.mark.parametrize("x", [1, 50, "no"])
@pytest.mark.parametrize("returns", ["dict", "model", "other"])
def test_outputs_fail_alike_on_every_path_when_the_serializer_raises(x: Any,
                                                                     returns: str) -> None:
    fn = {"dict": lambda m: {"x": m.x}, "model": lambda m: Stamped.model_construct(x=m.x),
          "other": lambda m: [m.x]}[returns]
    results = every_path(stamped_executor(fn), {"x": x, "y": 0})
    general = results["general sync"]
    for path, result in results.items():
        assert result == general, path
    if x == 50 and returns != "other":
        assert general.error.type == "PydanticSerializationError"
        assert "('s1', tool 'stamp') output validation raised" in general.error.message
        assert "cannot serialise" in general.error.message
    if x == 1 and returns != "other":
        assert general.success and general.steps[0].outputs == {"x": 1}


def test_step_start_times_count_from_the_runs_start() -> None:
    executor = stamped_executor(lambda m: {"x": m.x})
    result = executor.execute_flow("random", {"x": 1})
    starts = [record.started_ms for record in result.steps]
    assert 0 <= starts[0] <= starts[1]
    last = result.steps[-1]
    assert last.started_ms + last.duration_ms <= result.duration_ms
