"""Constants and JSON pointers in input mappings, through the Python API: definition
errors, the static data-flow check, running flows (both lanes), fallbacks, sub-flows,
and the flow input a first step's constants and pointers imply."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel, Field

from chainweaver import (
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mappings import Const, Pointer


class Address(BaseModel):
    city: str
    zip: str = ""


class Customer(BaseModel):
    name: str
    address: Address
    tags: list[str] = []


class Lookup(BaseModel):
    customer: Customer


class Report(BaseModel):
    report: str


@tool(output_schema=Lookup, safety=ToolSafetyContract("read"))
def find_customer(customer_id: str) -> dict:
    """Find a customer."""
    return {"customer": {"name": "Ada", "address": {"city": "Porto", "zip": "4000"},
                         "tags": ["vip", "eu"]}}


@tool(output_schema=Report, safety=ToolSafetyContract("read"))
def weather(city: str, units: str, days: int = 1) -> dict:
    """A forecast."""
    return {"report": f"{city}/{units}/{days}"}


@tool(output_schema=Report, safety=ToolSafetyContract("read"))
def tag_report(first_tag: str, settings: dict) -> dict:
    """Report a tag and settings."""
    settings["seen"] = True  # a tool changing its input must not change the constant
    return {"report": f"{first_tag}:{sorted(settings)}"}


def executor_with(*flows: Flow) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    for t in (find_customer, weather, tag_report):
        executor.register_tool(t)
    for flow in flows:
        executor.registry.register_flow(flow)
    return executor


def forecast(city: Any = None, units: Any = None, **more: Any) -> Flow:
    mapping = {"city": city or Pointer("/customer/address/city"),
               "units": units or Const("metric"), **more}
    return Flow("forecast", "Forecast for a customer's city.",
                [FlowStep("find_customer"), FlowStep("weather", mapping)])


# ------------------------------------------------------------- definitions


def test_pointer_and_const_values_are_checked_when_the_step_is_built() -> None:
    assert Pointer("/a/b~1c/d~0e").tokens == ("a", "b/c", "d~e")
    assert Pointer("/items/0").root == "items"
    for bad, words in [("a/b", "must start with '/'"), ("/", "must name a context key"),
                       ("/a/~2", "'~' must be followed by 0 or 1"),
                       ("/" + "/x" * 40, "more than 32 tokens")]:
        with pytest.raises(DefinitionError, match=words):
            Pointer(bad)
    with pytest.raises(DefinitionError, match="not a JSON value"):
        Const(object())
    with pytest.raises(DefinitionError, match="not a JSON number"):
        Const([1.0, float("nan")])
    with pytest.raises(DefinitionError, match="keys must be strings"):
        Const({1: "x"})
    with pytest.raises(DefinitionError, match=r"field 'units' has a int \(wrap a literal"):
        FlowStep("weather", {"units": 3})  # type: ignore[dict-item]


def test_mappings_keep_their_values_and_plain_keys_work_as_before() -> None:
    step = FlowStep("weather", {"city": Pointer("/c/city"), "units": Const("si"),
                                "days": "n"})
    assert step.input_mapping == {"city": Pointer("/c/city"), "units": Const("si"),
                                  "days": "n"}
    with pytest.raises(TypeError):
        step.input_mapping["x"] = "y"  # type: ignore[index]


# ------------------------------------------------------------- static checks


def test_a_well_wired_flow_has_no_problems_and_runs() -> None:
    executor = executor_with(forecast(days=Const(3)))
    assert executor.check_flow(executor.registry.get_flow("forecast")) == []
    result = executor.execute_flow("forecast", {"customer_id": "c1"})
    assert result.success, result.error
    assert result.final_output == {"report": "Porto/metric/3"}
    assert result.steps[1].inputs == {"city": "Porto", "units": "metric", "days": 3}


def test_a_pointer_to_a_field_the_producer_lacks_is_reported() -> None:
    executor = executor_with()
    problems = executor.flow_problems(forecast(city=Pointer("/customer/address/town")))
    assert [(p.kind, p.step_id, p.field) for p in problems] == [
        ("UnknownFieldError", "weather", "city")]
    assert problems[0].message == (
        "step 1 ('weather') maps field 'city' to JSON pointer '/customer/address/town', "
        "but in step 'find_customer' /customer/address has no field 'town' (its fields: "
        "city, zip)")


@pytest.mark.parametrize(("pointer", "words"), [
    ("/customer/name/first", "/customer/name is a string, with nothing inside"),
    ("/customer/tags/first", "/customer/tags is a list, and 'first' is not an index"),
    ("/client/name", "neither the flow input nor an earlier step provides context key "
                     "'client'"),
])
def test_pointers_that_can_never_find_a_value_are_reported(pointer: str, words: str) -> None:
    problems = executor_with().check_flow(forecast(city=Pointer(pointer)))
    assert len(problems) == 1 and words in problems[0], problems


def test_pointers_into_lists_and_free_form_values_pass_the_check() -> None:
    flow = Flow("tags", "First tag.", [
        FlowStep("find_customer"),
        FlowStep("tag_report", {"first_tag": Pointer("/customer/tags/1"),
                                "settings": Const({"mode": "fast"})}),
    ])
    executor = executor_with(flow)
    assert executor.check_flow(flow) == []
    first = executor.execute_flow("tags", {"customer_id": "c"})
    second = executor.execute_flow("tags", {"customer_id": "c"})
    assert first.final_output == second.final_output == {"report": "eu:['mode', 'seen']"}
    # Each run gets its own copy of the constant.
    assert flow.steps[1].input_mapping["settings"] == Const({"mode": "fast"})


def test_a_constant_integer_past_pythons_digit_limit_is_a_definition_error() -> None:
    # json.dumps cannot write it (ValueError): once it escaped from flow_problems.
    with pytest.raises(DefinitionError, match=r"Const: an integer at \[1\]\.days of more "
                       r"than \d+ digits is not a JSON number"):
        Const([0, {"days": -10 ** 5000}])
    assert Const(10 ** 4000).value == 10 ** 4000  # within the limit: a number like any
    problems = executor_with().flow_problems(forecast(days=Const(10 ** 300)))
    assert problems == []  # fits an int field; the run decides what the tool makes of it


def test_a_list_index_past_pythons_digit_limit_finds_nothing() -> None:
    # int() refuses more than 4300 digits (ValueError): such an index is past the end.
    class Pair(BaseModel):
        tags: tuple[str, str]

    huge = "9" * 5000
    flow = Flow("pair", "d", [FlowStep("tag_report", {
        "first_tag": Pointer(f"/tags/{huge}"), "settings": Const({})})], input_schema=Pair)
    executor = executor_with(flow)
    assert executor.flow_problems(flow) == []  # a tuple's index is checked at run time
    result = executor.execute_flow("pair", {"tags": ["a", "b"]})
    assert not result.success and result.error is not None
    assert result.error.type == "MissingContextKeyError"
    assert "/tags is a list of 2 items, with no index" in result.error.message


def test_a_constant_that_does_not_fit_its_field_is_reported() -> None:
    problems = executor_with().flow_problems(forecast(units=Const(5), days=Const("many")))
    assert [(p.kind, p.field) for p in problems] == [("ConstantTypeError", "units"),
                                                     ("ConstantTypeError", "days")]
    assert problems[0].message == ("step 1 ('weather') maps field 'units' to constant 5, "
                                   "which does not fit the field: Input should be a valid "
                                   "string")


def test_constraints_of_the_field_apply_to_constants() -> None:
    @tool
    def limited(count: int = Field(ge=1, le=10)) -> dict:  # noqa: B008 - pydantic style
        """Count."""
        return {"count": count}

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(limited)
    flow = Flow("limited", "d", [FlowStep("limited", {"count": Const(11)})])
    assert "less than or equal to 10" in executor.check_flow(flow)[0]
    assert executor.check_flow(Flow("ok", "d", [FlowStep("limited",
                                                         {"count": Const(10)})])) == []


def test_mapping_a_field_the_tool_does_not_have_is_reported_for_every_form() -> None:
    flow = forecast(colour=Const("red"), shade=Pointer("/customer/name"))
    problems = executor_with().check_flow(flow)
    assert [p.split(", which")[0] for p in problems] == [
        "step 1 ('weather') maps field 'colour'", "step 1 ('weather') maps field 'shade'"]


# ------------------------------------------------------------- at run time


def test_a_pointer_that_finds_nothing_at_run_time_fails_the_step_with_where() -> None:
    @tool
    def loose(customer_id: str) -> dict:
        """Undeclared output: the static check cannot know."""
        return {"customer": {"address": {}}}

    executor = executor_with()
    executor.register_tool(loose)
    executor.registry.register_flow(Flow("loose", "d", [
        FlowStep("loose"), FlowStep("weather", {"city": Pointer("/customer/address/city"),
                                                "units": Const("si")})]))
    assert executor.check_flow(executor.registry.get_flow("loose")) == []
    result = executor.execute_flow("loose", {"customer_id": "x"})
    assert not result.success
    assert (result.error.type, result.error.step_id, result.error.field) == (
        "MissingContextKeyError", "weather", "city")
    assert result.error.message == (
        "step 1 ('weather'): field 'city' reads JSON pointer '/customer/address/city', "
        "but /customer/address has no key 'city'")


def test_both_lanes_give_the_same_result_and_fallbacks_get_the_same_input() -> None:
    @tool(output_schema=Report, safety=ToolSafetyContract("read"))
    def broken(city: str, units: str, days: int = 1) -> dict:
        """Always fails."""
        raise ConnectionError("down")

    executor = executor_with()
    executor.register_tool(broken)
    executor.registry.register_flow(Flow("f", "d", [
        FlowStep("find_customer"),
        FlowStep("broken", {"city": Pointer("/customer/address/city"),
                            "units": Const("imperial")},
                 on_error="fallback", fallback="weather")]))
    sync = executor.execute_flow("f", {"customer_id": "1"})
    concurrent = asyncio.run(executor.execute_flow_async("f", {"customer_id": "1"}))
    assert sync.final_output == concurrent.final_output == {"report": "Porto/imperial/1"}
    assert sync.steps[1].fallback == "weather"


def test_a_sub_flow_step_maps_constants_and_pointers_onto_the_sub_flows_input() -> None:
    inner = Flow("inner", "Weather for a city.", [FlowStep("weather")])
    outer = Flow("outer", "d", [
        FlowStep("find_customer"),
        FlowStep(flow="inner", input_mapping={"city": Pointer("/customer/address/city"),
                                              "units": Const("kelvin")})])
    executor = executor_with(inner, outer)
    assert executor.check_flow(outer) == []
    assert executor.execute_flow("outer", {"customer_id": "1"}).final_output == {
        "report": "Porto/kelvin/1"}


# ------------------------------------------------------------- the flow input


def test_a_first_steps_constants_and_pointers_shape_the_flow_input() -> None:
    flow = Flow("direct", "Forecast from a customer record.", [
        FlowStep("weather", {"city": Pointer("/customer/address/city"),
                             "units": Const("metric")})])
    executor = executor_with(flow)
    assert executor.check_flow(flow) == []
    model = executor.plan(flow).input_model
    assert model is not None
    schema = model.model_json_schema()
    assert schema["required"] == ["customer"]
    assert set(schema["properties"]) == {"days", "customer"}  # neither city nor units
    result = executor.execute_flow("direct", {"customer": {"address": {"city": "Oslo"}},
                                              "days": 2})
    assert result.final_output == {"report": "Oslo/metric/2"}
    refused = executor.execute_flow("direct", {"city": "Oslo", "units": "metric"})
    assert (refused.error.type, refused.error.field) == ("InputValidationError", "customer")
    deeper = executor.execute_flow("direct", {"customer": {"address": {"town": "Oslo"}}})
    assert deeper.error.field == "customer.address.city"


def test_without_mappings_the_flow_input_is_the_first_tools_model() -> None:
    flow = Flow("plain", "d", [FlowStep("weather", {"days": "days"})])
    executor = executor_with(flow)
    assert executor.plan(flow).input_model is weather.input_schema


def test_a_first_step_reading_another_key_asks_the_caller_for_that_key() -> None:
    flow = Flow("renamed", "d", [FlowStep("weather", {"days": "n", "units": "system"})])
    executor = executor_with(flow)
    assert executor.check_flow(flow) == []
    model = executor.plan(flow).input_model
    assert model is not None
    schema = model.model_json_schema()
    assert list(schema["properties"]) == ["city", "n", "system"]
    assert schema["required"] == ["city", "system"] and schema["properties"]["n"]["default"] == 1
    assert executor.execute_flow("renamed", {"city": "Rome", "system": "si", "n": 4}
                                 ).final_output == {"report": "Rome/si/4"}
    assert executor.execute_flow("renamed", {"city": "Rome", "system": "si"}
                                 ).final_output == {"report": "Rome/si/1"}


def test_a_declared_input_schema_wins_and_pointers_into_it_are_checked() -> None:
    class Request(BaseModel):
        customer: Customer

    good = Flow("good", "d", [FlowStep("weather", {"city": Pointer("/customer/address/city"),
                                                   "units": Const("si")})],
                input_schema=Request)
    bad = Flow("bad", "d", [FlowStep("weather", {"city": Pointer("/customer/city"),
                                                 "units": Const("si")})],
               input_schema=Request)
    executor = executor_with(good)
    assert executor.plan(good).input_model is Request
    assert executor.check_flow(good) == []
    assert executor.check_flow(bad) == [
        "step 0 ('weather') maps field 'city' to JSON pointer '/customer/city', but in the "
        "flow input /customer has no field 'city' (its fields: name, address, tags)"]
