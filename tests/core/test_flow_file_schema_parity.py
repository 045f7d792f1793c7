"""The published flow-file JSON Schema and the reader agree: every file the reader
loads is valid against the schema, so a file the schema (an editor, a CI step)
refuses never loads; the reader refuses more only for what JSON Schema cannot say
(docs/flow-files.md lists it). And no content, however wrong, makes the reader fail
with anything but a ``FlowFileError``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainweaver.errors import FlowFileError
from chainweaver.files import flow_from_data, read_flow_data
from chainweaver.flow_format import flow_file_schema

VALIDATOR = jsonschema.Draft202012Validator(flow_file_schema())
ROOT = Path(__file__).resolve().parents[2]

FULL: dict[str, Any] = {
    "name": "p", "version": "1.0.0", "title": "T", "description": "d",
    "governance": {"lifecycle": "active", "owner": "o", "publish": True},
    "safety": {"side_effects": "read", "idempotent": True, "requires_approval": False,
               "approval_reason": "r", "open_world": False},
    "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
    "output_schema": "chainweaver.flow_format:GovernanceFormat",  # an imported model
    "steps": ["t", {"tool": "u", "id": "x", "after": ["t"], "when": "a == 1",
                    "input_mapping": {"a": "b", "c": {"pointer": "/a"}, "d": {"const": 1}},
                    "output_mapping": {"k": "v"},
                    "retry": {"max_attempts": 2, "backoff_seconds": 0.1,
                              "max_backoff_seconds": 1, "jitter": 0.1,
                              "retry_on": ["ValueError"]},
                    "timeout": 5, "on_error": "fallback", "fallback": "w",
                    "requires": {"scopes": ["s"], "claims": {"c": ["v"]}}}],
    "prompts": [{"name": "pr", "title": "t", "description": "d",
                 "arguments": [{"name": "a", "description": "d", "required": True}],
                 "messages": [{"role": "user", "text": "{{ a }}"}]}],
    "task_mode": "optional", "requires": ["s"],
    "delegations": [{"step": "x", "reason": "r"}],
}


def loads(data: Any) -> bool:
    try:
        flow_from_data(data, "x.flow.json")
    except FlowFileError:
        return False
    return True


def minimal(**parts: Any) -> dict[str, Any]:
    return {"name": "p", "description": "d", "steps": ["t"], **parts}


@pytest.mark.parametrize("data", [
    # Optional keys whose constraints pydantic left out of the schema ("gt", no pattern).
    minimal(steps=[{"tool": "a b"}]),
    minimal(steps=[{"flow": "a/b"}]),
    minimal(steps=[{"tool": "t", "on_error": "fallback", "fallback": "a b"}]),
    minimal(steps=[{"tool": "t", "id": ""}]),
    minimal(steps=[{"tool": "t", "id": "a/b"}]),
    minimal(steps=[{"tool": "t", "id": "x#fallback"}]),  # a fallback's key path
    minimal(steps=[{"tool": "t", "timeout": 0}]),
    minimal(steps=[{"tool": "t", "timeout": 2592001}]),
    minimal(steps=[{"tool": "t", "when": ""}]),
    minimal(version=""),
    minimal(prompts=[{"name": "p", "arguments": [{"name": "A B"}],
                      "messages": [{"role": "user", "text": "x"}]}]),
    minimal(input_schema="json"),
    minimal(input_schema="a b:C"),
    minimal(output_schema={"type": "string"}),
    minimal(output_schema={"properties": {}}),
    minimal(task_mode=None),
    # A mapping of claim values iterated over its keys: {"type": null} accepted "type".
    minimal(requires={"claims": {"team": {"type": None}}}),
])
def test_what_the_reader_refuses_the_schema_refuses(data: dict[str, Any]) -> None:
    assert not loads(data)
    assert not VALIDATOR.is_valid(data)


@pytest.mark.parametrize("data", [
    minimal(safety={"side_effects": "write", "idempotent": None}),  # null: the default
    FULL,
])
def test_what_the_schema_accepts_the_reader_accepts(data: dict[str, Any]) -> None:
    assert VALIDATOR.is_valid(data)
    assert loads(data)


@pytest.mark.parametrize("kind", [{}, [[], "null"], [{}, "null"], ["null", {}]])
def test_an_inline_type_that_is_no_name_is_a_file_error_not_a_crash(kind: Any) -> None:
    data = minimal(input_schema={"type": "object", "properties": {"a": {"type": kind}}})
    with pytest.raises(FlowFileError) as raised:
        flow_from_data(data, "x.flow.json")
    assert raised.value.field == "input_schema.properties.a.type"


def test_the_shipped_example_flows_are_valid_against_the_schema() -> None:
    files = sorted((ROOT / "examples" / "flows").glob("*.flow.*"))
    assert files
    for path in files:
        assert list(VALIDATOR.iter_errors(read_flow_data(path))) == [], path


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*path, index))
    return found


PATHS = _paths(FULL)[1:]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 200) | st.floats(-1, 1e7, allow_nan=False)
    | st.sampled_from(["", "x", "a b", "a/b", "/a", "1.0", "none", "fallback", "json:X",
                       "Exception", "object", "string"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["type", "x", "tool", "const", "pointer"]), inner,
                      max_size=2),
    max_leaves=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), st.booleans(), JSON_VALUES),
                min_size=1, max_size=3))
def test_a_file_that_loads_is_valid_against_the_schema(
        edits: list[tuple[tuple[Any, ...], bool, Any]]) -> None:
    data = copy.deepcopy(FULL)
    for path, delete, value in edits:
        target: Any = data
        try:
            for key in path[:-1]:
                target = target[key]
            if delete and isinstance(target, dict):
                target.pop(path[-1], None)
            else:
                target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    if loads(data):  # anything else than a FlowFileError fails the test here
        assert VALIDATOR.is_valid(data), json.dumps(data)
