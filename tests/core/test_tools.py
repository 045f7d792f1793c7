"""Tool construction checks and the @tool decorator."""

from __future__ import annotations

import asyncio
from typing import Annotated

import pytest
from pydantic import BaseModel, Field, ValidationError

from chainweaver import (
    ChainWeaverError,
    DefinitionError,
    Flow,
    FlowStep,
    InvalidNameError,
    SideEffectLevel,
    Tool,
    ToolSafetyContract,
    tool,
)


class In(BaseModel):
    text: str


class Out(BaseModel):
    length: int


def count(model: In) -> dict:
    return {"length": len(model.text)}


# ------------------------------------------------------------------- Tool(...)


def test_tool_holds_its_definition() -> None:
    safety = ToolSafetyContract("read")
    t = Tool("count_chars", "Count characters.", In, Out, count, safety=safety)
    assert (t.name, t.description, t.input_schema, t.output_schema, t.fn, t.safety) == (
        "count_chars", "Count characters.", In, Out, count, safety
    )
    assert t.is_async is False
    assert t.input_fields == ("text",)
    assert repr(t) == "Tool(name='count_chars')"


def test_tool_defaults_description_and_safety_and_allows_no_output_schema() -> None:
    t = Tool("count", None, In, None, count)  # type: ignore[arg-type]
    assert t.description == ""
    assert t.safety is None
    assert t.output_schema is None


def test_async_fn_is_detected() -> None:
    async def afn(model: In) -> dict:
        return {}

    assert Tool("a", "", In, None, afn).is_async is True


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "slash/name", "ünï", None, 3])
def test_invalid_tool_names(name) -> None:
    with pytest.raises(InvalidNameError) as caught:
        Tool(name, "", In, None, count)
    assert isinstance(caught.value, DefinitionError)
    assert isinstance(caught.value, ChainWeaverError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("name", ["a", "x" * 64, "order.lookup-v2_final", "A9"])
def test_valid_tool_names(name: str) -> None:
    assert Tool(name, "", In, None, count).name == name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_schema": dict}, "input_schema"),
        ({"input_schema": In(text="x")}, "input_schema"),
        ({"output_schema": dict}, "output_schema"),
        ({"fn": "not callable"}, "fn must be callable"),
        ({"safety": "read"}, "safety"),
    ],
)
def test_tool_rejects_bad_definitions(kwargs: dict, message: str) -> None:
    arguments = {"name": "t", "description": "", "input_schema": In, "output_schema": None,
                 "fn": count} | kwargs
    with pytest.raises(DefinitionError, match=message):
        Tool(**arguments)


# ------------------------------------------------------------------- @tool


def test_decorator_builds_input_model_from_type_hints() -> None:
    @tool
    def fetch_order(order_id: str, limit: int = 3,
                    tag: Annotated[str, Field(description="A tag")] = "x") -> dict:
        """Fetch an order.

        Longer explanation that is not part of the description.
        """
        return {"order_id": order_id, "limit": limit, "tag": tag}

    assert isinstance(fetch_order, Tool)
    assert fetch_order.name == "fetch_order"
    assert fetch_order.description == "Fetch an order."
    assert fetch_order.input_fields == ("order_id", "limit", "tag")
    assert fetch_order.output_schema is None  # dict is not a pydantic model
    model = fetch_order.input_schema
    assert model.__name__ == "FetchOrderInput"
    assert model.model_fields["order_id"].is_required()
    assert model.model_fields["limit"].default == 3
    assert model.model_json_schema()["properties"]["tag"]["description"] == "A tag"
    with pytest.raises(ValidationError):
        model.model_validate({"limit": 1})
    # The tool's fn takes the validated model and spreads it into the function.
    assert fetch_order.fn(model(order_id="A", limit=2)) == {
        "order_id": "A", "limit": 2, "tag": "x"
    }


def test_field_defaults_with_metadata_are_kept() -> None:
    @tool
    def search(query: str = Field(examples=["shoes"]), limit: int = Field(5, ge=1)) -> dict:
        return {}

    schema = search.input_schema.model_json_schema()
    assert schema["required"] == ["query"]
    assert schema["properties"]["query"]["examples"] == ["shoes"]
    assert schema["properties"]["limit"]["minimum"] == 1


def test_decorator_uses_a_single_model_parameter_directly() -> None:
    seen = []

    @tool
    def measure(request: In) -> Out:
        seen.append(request)
        return Out(length=len(request.text))

    assert measure.input_schema is In
    assert measure.output_schema is Out
    assert measure.fn(In(text="abc")) == Out(length=3)
    assert seen == [In(text="abc")]  # fn receives the model itself


def test_output_schema_keyword_and_overrides() -> None:
    safety = ToolSafetyContract(SideEffectLevel.NONE)

    @tool(name="shout.v2", description="Upper-case it.", output_schema=Out, safety=safety)
    def shout(text: str) -> dict:
        """Ignored docstring."""
        return {"length": len(text)}

    assert shout.name == "shout.v2"
    assert shout.description == "Upper-case it."
    assert shout.output_schema is Out
    assert shout.safety is safety
    assert shout.input_schema.__name__ == "ShoutV2Input"


def test_output_schema_keyword_beats_the_return_annotation() -> None:
    class Other(BaseModel):
        length: int
        extra: str = ""

    @tool(output_schema=Other)
    def measure(text: str) -> Out:
        return Out(length=len(text))

    assert measure.output_schema is Other


def test_no_docstring_gives_an_empty_description() -> None:
    @tool
    def bare(x: int) -> dict:
        return {}

    assert bare.description == ""


def test_multi_line_first_paragraph_is_joined() -> None:
    @tool
    def doc(x: int) -> dict:
        """First line
        continues here.

        Second paragraph."""
        return {}

    assert doc.description == "First line continues here."


def test_async_function_becomes_an_async_tool() -> None:
    @tool
    async def slow_double(x: int) -> dict:
        await asyncio.sleep(0)
        return {"y": 2 * x}

    assert slow_double.is_async
    result = asyncio.run(slow_double.fn(slow_double.input_schema(x=4)))
    assert result == {"y": 8}


def test_async_function_with_a_model_parameter() -> None:
    @tool
    async def amodel(request: In) -> Out:
        return Out(length=len(request.text))

    assert amodel.is_async and amodel.input_schema is In
    assert asyncio.run(amodel.fn(In(text="ab"))) == Out(length=2)


def test_function_without_parameters() -> None:
    @tool
    def now() -> dict:
        return {"t": 0}

    assert now.input_fields == ()
    assert now.fn(now.input_schema()) == {"t": 0}


@pytest.mark.parametrize(
    "source",
    [
        "def f(*args: int) -> dict: return {}",
        "def f(**kwargs: int) -> dict: return {}",
        "def f(x) -> dict: return {}",
    ],
)
def test_unsupported_signatures(source: str) -> None:
    namespace: dict = {}
    exec(source, namespace)
    with pytest.raises(DefinitionError, match="f"):
        tool(namespace["f"])


def test_decorator_validates_the_name() -> None:
    with pytest.raises(InvalidNameError):
        @tool(name="bad name")
        def anything(x: int) -> dict:
            return {}


def test_unresolvable_type_hints_are_a_definition_error() -> None:
    def local(x: Missing) -> dict:  # noqa: F821
        return {}

    with pytest.raises(DefinitionError, match="cannot resolve the type hints"):
        tool(local)


class _Incomplete(BaseModel):
    value: NotDefinedAnywhere  # noqa: F821 - deliberately unresolvable


def test_incomplete_model_is_a_definition_error_for_tools_and_flows() -> None:
    with pytest.raises(DefinitionError, match=r"tool 'half': input_schema _Incomplete is "
                                              r"not fully defined: .*NotDefinedAnywhere"):
        Tool("half", "d", _Incomplete, None, lambda model: {})
    with pytest.raises(DefinitionError, match=r"flow 'half': output_schema _Incomplete is "
                                              r"not fully defined"):
        Flow("half", "d", [FlowStep("t")], output_schema=_Incomplete)


class _ForwardLater(BaseModel):
    child: _DefinedAfter


class _DefinedAfter(BaseModel):
    n: int


def test_forward_reference_resolved_later_is_rebuilt_and_accepted() -> None:
    assert not _ForwardLater.__pydantic_complete__
    made = Tool("later", "d", _ForwardLater, None, lambda model: {"n": model.child.n})
    assert made.input_schema.__pydantic_complete__
    assert _ForwardLater.model_validate({"child": {"n": 3}}).child.n == 3
