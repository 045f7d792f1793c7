"""A tool that could never be called as written is refused by ``@tool`` with a
``DefinitionError`` naming the tool and the parameter, never a pydantic traceback at
definition time or a ``TypeError`` on every run."""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
from pydantic import BaseModel

from chainweaver import DefinitionError, Tool, tool


def _define(fn: Any) -> Any:
    return tool(fn)


def test_an_annotation_pydantic_has_no_schema_for_names_the_parameter() -> None:
    def connect(host: str, sock: socket.socket) -> dict:
        return {}

    with pytest.raises(DefinitionError) as caught:
        _define(connect)
    assert str(caught.value) == (
        "tool 'connect': parameter 'sock' (annotated socket) cannot be an input field: "
        "pydantic cannot validate it or describe it in JSON Schema (use JSON types, or a "
        "pydantic model)")


def test_a_positional_only_parameter_is_refused_rather_than_failing_every_run() -> None:
    def double(x: int, /) -> dict:
        return {"y": 2 * x}

    with pytest.raises(DefinitionError, match=r"^tool 'double': parameter 'x' is "
                       r"positional-only; a tool's fields are passed by name \(remove the "
                       r"'/'\)$"):
        _define(double)


@pytest.mark.parametrize("name, problem", [
    ("_secret", "a name starting with '_' is private to pydantic; rename it"),
    ("model_config", "the name is taken by pydantic's BaseModel; rename it"),
])
def test_a_parameter_name_pydantic_reserves_is_named(name: str, problem: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def lookup({name}: int) -> dict:\n    return {{}}\n", namespace)  # noqa: S102
    with pytest.raises(DefinitionError) as caught:
        _define(namespace["lookup"])
    assert str(caught.value).startswith(f"tool 'lookup': parameter {name!r} ")
    assert str(caught.value).endswith(problem)


def test_a_model_named_parameter_pydantic_accepts_stays_a_field() -> None:
    @tool
    def predict(model_id: str, schema: int = 1) -> dict:
        return {"id": model_id}

    assert predict.input_fields == ("model_id", "schema")


@pytest.mark.parametrize("annotation, shown", [
    ("str", "str"), ("int", "int"), ("None", "None"), ("list[int]", "list[int]"),
    ("Iterator[dict]", "collections.abc.Iterator[dict]"),
])
def test_a_return_annotation_that_is_no_dict_or_model_is_refused(annotation: str,
                                                                 shown: str) -> None:
    namespace: dict[str, Any] = {"Iterator": Iterator}
    exec(f"def answer(q: str) -> {annotation}:\n    return None\n", namespace)  # noqa: S102
    with pytest.raises(DefinitionError) as caught:
        _define(namespace["answer"])
    assert str(caught.value) == (
        f"tool 'answer': returns {shown} by its annotation, but a tool returns a dict or "
        "a pydantic model (annotate -> dict, or return a model)")


class Row(TypedDict):
    id: int


@pytest.mark.parametrize("annotation", ["dict", "dict[str, int]", "Row", "Any",
                                        "BaseModel", "dict | None"])
def test_return_annotations_that_can_be_a_dict_or_model_are_accepted(annotation: str) -> None:
    namespace: dict[str, Any] = {"Row": Row, "Any": Any, "BaseModel": BaseModel}
    exec(f"def answer(q: str) -> {annotation}:\n    return {{}}\n", namespace)  # noqa: S102
    made = _define(namespace["answer"])
    assert made.output_schema is None  # no model declared: the output is not validated


def test_output_schema_beats_a_return_annotation_it_replaces() -> None:
    class Answer(BaseModel):
        text: str

    @tool(output_schema=Answer)
    def answer(q: str) -> Any:
        return {"text": q}

    assert answer.output_schema is Answer


def test_a_callable_that_is_no_function_is_named_with_what_to_write() -> None:
    def add(x: int, y: int) -> dict:
        return {"sum": x + y}

    with pytest.raises(DefinitionError, match=r"^cannot name a tool for functools\.partial"
                       r"\(.*\): pass name=$"):
        _define(functools.partial(add, y=1))
    with pytest.raises(DefinitionError, match=r"^tool 'add_one': cannot read the type hints "
                       r"of partial .*; make the tool a function \(def or async def\)$"):
        tool(name="add_one")(functools.partial(add, y=1))


def test_base_model_itself_is_no_model_to_declare() -> None:
    with pytest.raises(DefinitionError, match=r"^tool 'echo': input_schema must be a pydantic "
                       r"model class \(a subclass of BaseModel, not BaseModel itself\)$"):
        Tool("echo", "Echo.", BaseModel, None, lambda model: {})
