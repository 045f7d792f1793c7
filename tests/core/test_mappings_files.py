"""Constants and JSON pointers in flow files (YAML and JSON): loading, errors naming the
field, the flow-file JSON Schema, and what an MCP client is asked for and gets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastmcp import Client
from pydantic import BaseModel

from chainweaver import (
    FlowExecutor,
    FlowFileError,
    FlowRegistry,
    ToolSafetyContract,
    load_flows,
    tool,
)
from chainweaver.files import flow_from_data
from chainweaver.flow_format import flow_file_schema
from chainweaver.mappings import Const, Pointer
from chainweaver.mcp import FlowServer


class Address(BaseModel):
    city: str


class Customer(BaseModel):
    name: str
    address: Address


class Lookup(BaseModel):
    customer: Customer


class Report(BaseModel):
    report: str


@tool(output_schema=Lookup, safety=ToolSafetyContract("read"))
def find_customer(customer_id: str) -> dict:
    """Find a customer."""
    return {"customer": {"name": "Ada", "address": {"city": "Porto"}}}


@tool(output_schema=Report, safety=ToolSafetyContract("read"))
def weather(city: str, units: str, days: int = 1) -> dict:
    """A forecast."""
    return {"report": f"{city}/{units}/{days}"}


FORECAST_YAML = """\
name: forecast
description: Forecast for a customer's city.
steps:
  - find_customer
  - tool: weather
    input_mapping:
      city: {pointer: /customer/address/city}
      units: {const: metric}
      days: {const: 3}
"""

DIRECT = {
    "name": "direct",
    "description": "Forecast from a customer record.",
    "steps": [{"tool": "weather", "input_mapping": {
        "city": {"pointer": "/customer/address/city"}, "units": {"const": "metric"}}}],
}


def executor_for(tmp_path: Path) -> FlowExecutor:
    (tmp_path / "forecast.flow.yaml").write_text(FORECAST_YAML)
    (tmp_path / "direct.flow.json").write_text(json.dumps(DIRECT))
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(find_customer)
    executor.register_tool(weather)
    for flow in load_flows(tmp_path, tools=executor.tools):
        executor.registry.register_flow(flow)
    return executor


def test_files_load_constants_and_pointers_and_the_flows_run(tmp_path: Path) -> None:
    executor = executor_for(tmp_path)
    forecast = executor.registry.get_flow("forecast")
    assert dict(forecast.steps[1].input_mapping) == {
        "city": Pointer("/customer/address/city"), "units": Const("metric"),
        "days": Const(3)}
    assert executor.check_flow(forecast) == []
    assert executor.execute_flow("forecast", {"customer_id": "1"}).final_output == {
        "report": "Porto/metric/3"}
    direct = executor.execute_flow("direct", {"customer": {"address": {"city": "Oslo"}}})
    assert direct.final_output == {"report": "Oslo/metric/1"}


def test_every_form_is_valid_by_the_flow_file_json_schema() -> None:
    validator = jsonschema.Draft202012Validator(flow_file_schema())
    assert list(validator.iter_errors(DIRECT)) == []
    for const in (None, [1, 2], {"a": {"b": True}}, "x"):
        step = {"tool": "t", "input_mapping": {"f": {"const": const}, "g": "key"}}
        assert list(validator.iter_errors({**DIRECT, "steps": [step]})) == []
    for bad in ({"pointer": "no-slash"}, {"const": 1, "pointer": "/a"}, {"value": 1}, 7,
                {"pointer": "/a", "extra": 1}, {}):
        step = {"tool": "t", "input_mapping": {"f": bad}}
        assert list(validator.iter_errors({**DIRECT, "steps": [step]})), bad


@pytest.mark.parametrize(("value", "field", "words"), [
    (7, "steps[0].input_mapping.f", "must be a string (a context key), {pointer: /path} "
     "(a JSON pointer into the context) or {const: value} (a constant), got a number (7)"),
    ({"const": 1, "pointer": "/a"}, "steps[0].input_mapping.f", "must be a string"),
    ({"value": 1}, "steps[0].input_mapping.f", "got a mapping"),
    ({"pointer": "a/b"}, "steps[0].input_mapping.f.pointer", "must start with '/'"),
    ({"pointer": 3}, "steps[0].input_mapping.f.pointer", "must be a string"),
    ({"pointer": "/a/~x"}, "steps[0].input_mapping.f.pointer",
     "'~' must be followed by 0 or 1"),
])
def test_bad_mapping_values_name_the_field(value: Any, field: str, words: str) -> None:
    data = {**DIRECT, "steps": [{"tool": "t", "input_mapping": {"f": value}}]}
    with pytest.raises(FlowFileError) as caught:
        flow_from_data(data, "x.flow.json")
    assert caught.value.field == field
    assert words in caught.value.problem


def test_a_constant_that_is_not_json_names_the_field() -> None:
    data = {**DIRECT, "steps": [{"tool": "t", "input_mapping": {"f": {"const": [1, object()]}}}]}
    with pytest.raises(FlowFileError) as caught:
        flow_from_data(data, "x.flow.json")
    assert caught.value.field == "steps[0].input_mapping.f.const"
    assert "is not a JSON value" in caught.value.problem


def test_loading_with_tools_checks_mapped_fields_of_every_form(tmp_path: Path) -> None:
    bad = {**DIRECT, "steps": [{"tool": "weather", "input_mapping": {
        "town": {"pointer": "/customer/town"}}}]}
    (tmp_path / "bad.flow.json").write_text(json.dumps(bad))
    with pytest.raises(FlowFileError, match=r"steps\[0\]\.input_mapping\.town: tool "
                       "'weather' has no input field 'town'"):
        load_flows(tmp_path, tools={"weather": weather})


@pytest.mark.anyio
async def test_an_mcp_client_is_asked_only_for_what_the_flow_needs(tmp_path: Path) -> None:
    server = FlowServer(executor_for(tmp_path))
    async with Client(server.fastmcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
        direct = tools["direct"].input_schema
        # units comes from a constant, city from the pointer: the caller gives customer.
        assert direct["required"] == ["customer"]
        assert set(direct["properties"]) == {"days", "customer"}
        assert direct["properties"]["customer"]["properties"]["address"]["required"] == [
            "city"]
        jsonschema.validate({"customer": {"address": {"city": "Oslo"}}}, direct)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"customer": {"address": {}}}, direct)
        forecast = tools["forecast"].input_schema
        assert forecast["required"] == ["customer_id"]
        assert set(forecast["properties"]) == {"customer_id"}
        result = await client.call_tool("direct", {"customer": {"address": {"city": "Oslo"}},
                                                   "days": 5})
        assert result.structured_content == {"report": "Oslo/metric/5"}
        refused = await client.call_tool("direct", {"city": "Oslo"}, raise_on_error=False)
        assert refused.is_error
