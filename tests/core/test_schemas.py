"""chainweaver.schemas: cached JSON Schemas and example values that fit them."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from chainweaver.schemas import (
    example_arguments,
    example_value,
    model_json_schema,
    resolve_property,
)


class Address(BaseModel):
    city: str
    zip_code: str = Field(min_length=5)


class Request(BaseModel):
    query: str = Field(examples=["red shoes"])
    limit: int = Field(ge=3, le=50)
    price: float = Field(gt=0)
    below: int = Field(le=-2)
    cap: float = Field(le=10)
    sort: Literal["relevance", "price"]
    fixed: Literal["only"]
    address: Address
    billing: Address | None = None
    tags: list[str] = Field(min_length=2)
    flags: list[bool]
    active: bool
    nothing: None
    anything: object
    ratio: float
    count: int
    page: int = 1


def test_model_json_schema_is_cached_per_class() -> None:
    first = model_json_schema(Request)
    assert first is model_json_schema(Request)
    assert first == Request.model_json_schema()


def test_example_arguments_fill_required_fields_with_valid_values() -> None:
    schema = model_json_schema(Request)
    arguments = example_arguments(schema)
    assert set(arguments) == set(schema["required"])  # optional "billing"/"page" left out
    assert arguments["query"] == "red shoes"  # the declared example wins
    assert arguments["sort"] == "relevance" and arguments["fixed"] == "only"
    assert arguments["limit"] == 3 and arguments["below"] == -2 and arguments["cap"] == 0
    assert arguments["address"] == {"city": "x", "zip_code": "xxxxx"}
    assert arguments["tags"] == ["x", "x"] and arguments["flags"] == []
    Request.model_validate(arguments)  # the example is accepted by the model


def test_example_value_fallbacks() -> None:
    assert example_value({"type": "string", "example": "e"}) == "e"
    assert example_value({"type": "integer", "default": 7}) == 7
    assert example_value({"type": ["null", "integer"]}) == 0
    assert example_value({"type": "number", "exclusiveMinimum": 1}) == 2.0
    assert example_value({}) == "example"
    assert example_value({"properties": {"a": {"type": "boolean"}}, "required": ["a"]}) == {
        "a": False
    }
    defaulted = {"type": "array", "default": [1]}
    value = example_value(defaulted)
    value.append(2)
    assert defaulted["default"] == [1]  # examples and defaults are copies


def test_resolve_property_unwraps_refs_allof_and_nullable_anyof() -> None:
    root = {"$defs": {"A": {"type": "object", "title": "A"}}}
    assert resolve_property({"$ref": "#/$defs/A", "description": "d"}, root) == {
        "type": "object", "title": "A", "description": "d"
    }
    assert resolve_property({"allOf": [{"$ref": "#/$defs/A"}]}, root)["title"] == "A"
    assert resolve_property({"anyOf": [{"type": "null"}, {"type": "integer"}]}, root) == {
        "type": "integer"
    }
    only_null = {"anyOf": [{"type": "null"}]}
    assert resolve_property(only_null, root) == only_null
    assert resolve_property({"$ref": "#/$defs/Missing"}, root) == {}


def test_recursive_schema_terminates() -> None:
    loop = {"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}
    assert isinstance(resolve_property(loop, loop), dict)


@pytest.mark.parametrize("model", [Address, Request])
def test_examples_validate(model: type[BaseModel]) -> None:
    model.model_validate(example_arguments(model_json_schema(model)))
