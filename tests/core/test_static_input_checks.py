"""Two mistakes that used to surface only when a flow ran, now found when it is
checked (``check_flow``, ``chainweaver validate``, the exposure decision): a ``when``
condition reading a key nothing provides, and a flow input that accepts values its
step's field does not take (a ``str`` feeding an ``int``, a float an integer, an
optional input a required field)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.files import flow_from_data
from chainweaver.mcp import FlowServer

READ = ToolSafetyContract("read")


class Total(BaseModel):
    total: int


class Scaled(BaseModel):
    scaled: float


@tool(safety=READ)
def count(n: int) -> Total:
    """Count (a declared output: what it writes is known)."""
    return Total(total=n)


@tool(safety=READ)
def scale(total: int, factor: float = 1.0) -> Scaled:
    """Scale."""
    return Scaled(scaled=total * factor)


def executor() -> FlowExecutor:
    made = FlowExecutor(FlowRegistry())
    made.register_tool(count)
    made.register_tool(scale)
    return made


def excluded_reason(made: FlowExecutor, flow: Flow) -> str | None:
    made.registry.register_flow(flow)
    [entry] = [e for e in FlowServer(made).exposure_report() if e.flow_name == flow.name]
    return entry.reason


# ------------------------------------------------------------------ conditions


def test_a_condition_reading_a_key_nothing_provides_is_a_problem() -> None:
    made = executor()
    flow = Flow("typo", "d", [FlowStep("count"),
                              FlowStep("scale", when="totl > 3")])
    message = ("step 1 ('scale') has a condition reading 'totl', which neither the flow "
               "input nor a step it runs after provides (it would always be None)")
    assert made.check_flow(flow) == [message]
    assert made.flow_problems(flow)[0].kind == "MissingContextKeyError"
    assert excluded_reason(made, flow) == f"flow is invalid: {message}"


@pytest.mark.parametrize("condition", ["total > 3", "n > 3", "total is not None and n < 9"])
def test_a_condition_reading_the_input_or_an_earlier_output_is_fine(condition: str) -> None:
    made = executor()
    flow = Flow("fine", "d", [FlowStep("count"), FlowStep("scale", when=condition)])
    assert made.check_flow(flow) == []
    assert excluded_reason(made, flow) is None


def test_a_condition_on_a_step_it_does_not_wait_for_is_a_problem() -> None:
    made = executor()
    flow = Flow("apart", "d", [FlowStep("count"),
                               FlowStep("scale", after=(), when="n > 1",
                                        input_mapping={"total": "n"})],
                output_schema=Scaled)
    assert made.check_flow(flow) == []  # n is flow input: fine
    flow = Flow("apart", "d", [FlowStep("count"),
                               FlowStep("scale", after=(), when="total > 1",
                                        input_mapping={"total": "n"})],
                output_schema=Scaled)
    assert made.check_flow(flow) == [
        "step 1 ('scale') has a condition reading 'total', which neither the flow input "
        "nor a step it runs after provides (it would always be None)"]


# ------------------------------------------------------------------ input types


class Text(BaseModel):
    n: str


class Fraction(BaseModel):
    n: float


class Maybe(BaseModel):
    n: int | None = None


class Exact(BaseModel):
    n: int


class Whole(BaseModel):
    n: Literal[1, 2, 3]


class Colour(StrEnum):
    RED = "red"


class Painted(BaseModel):
    n: int
    colour: Colour


class Untyped(BaseModel):
    n: Any


@pytest.mark.parametrize("model, why", [
    (Text, "the flow input's 'n' may be string, which the field (of type integer) does "
           "not take"),
    (Fraction, "the flow input's 'n' may be number, which the field (of type integer) "
               "does not take"),
    (Maybe, "the flow input's 'n' may be null, which the field (of type integer) does "
            "not take"),
])
def test_an_input_the_first_step_would_refuse_is_a_problem(model: type[BaseModel],
                                                           why: str) -> None:
    made = executor()
    flow = Flow("subtle", "d", [FlowStep("count")], input_schema=model)
    message = (f"step 0 ('count') takes field 'n' from the flow input as is, but {why}: "
               "an input the flow accepts would fail the step")
    assert made.check_flow(flow) == [message]
    assert made.flow_problems(flow)[0].kind == "InputTypeError"
    assert excluded_reason(made, flow) == f"flow is invalid: {message}"


@pytest.mark.parametrize("model", [Exact, Whole, Painted, Untyped])
def test_an_input_every_value_of_which_the_step_takes_is_fine(model: type[BaseModel]) -> None:
    made = executor()
    flow = Flow("sound", "d", [FlowStep("count")], input_schema=model)
    assert made.check_flow(flow) == []
    assert excluded_reason(made, flow) is None


def test_an_integer_input_may_feed_a_number_field_of_a_later_step() -> None:
    class Input(BaseModel):
        n: int
        factor: int = 2

    made = executor()
    flow = Flow("later", "d", [FlowStep("count"), FlowStep("scale")], input_schema=Input)
    assert made.check_flow(flow) == []
    made.registry.register_flow(flow)
    assert made.execute_flow(flow.name, {"n": 2}).final_output == {"scaled": 4.0}


def test_a_later_step_reading_the_input_is_checked_too_but_not_after_a_step_wrote_it(
) -> None:
    class Input(BaseModel):
        n: int
        factor: str  # scale takes a float

    made = executor()
    flow = Flow("later", "d", [FlowStep("count"), FlowStep("scale")], input_schema=Input)
    assert made.check_flow(flow) == [
        "step 1 ('scale') takes field 'factor' from the flow input as is, but the flow "
        "input's 'factor' may be string, which the field (of type number) does not take: "
        "an input the flow accepts would fail the step"]

    class Named(BaseModel):
        n: str  # count's output 'total' feeds scale; 'n' feeds count: a problem

    flow = Flow("later", "d", [FlowStep("count"), FlowStep("scale")], input_schema=Named)
    assert [p.step_id for p in made.flow_problems(flow)] == ["count"]


def test_an_optional_inline_property_without_default_feeding_a_required_field() -> None:
    made = executor()
    flow = flow_from_data({"name": "inline", "description": "d", "steps": ["count"],
                           "input_schema": {"type": "object",
                                            "properties": {"n": {"type": "integer"}}}})
    assert made.check_flow(flow) == [
        "step 0 ('count') takes field 'n' from the flow input as is, but the flow input's "
        "'n' is optional without a default, and the field is required: an input the flow "
        "accepts would fail the step"]
    # What the run did before: the flow accepted {} and failed its step.
    made.registry.register_flow(flow)
    assert made.execute_flow("inline", {}).error.type == "StepInputError"
