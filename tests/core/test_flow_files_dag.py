"""Flow files with DAG steps: every step key loads, mistakes name the file and field, and
the published JSON Schema accepts exactly what the reader accepts (examples included)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from chainweaver import FlowFileError, RetryPolicy
from chainweaver.files import find_flow_files, flow_from_data, read_flow_data
from chainweaver.flow_format import flow_file_schema

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(flow_file_schema())


def flow(*steps, **extra) -> dict:
    return {"name": "f", "description": "d", "steps": list(steps), **extra}


FULL = flow(
    "load",
    {"tool": "check", "id": "check_a", "after": [], "when": "x > 1 and y is None",
     "retry": {"max_attempts": 4, "backoff_seconds": 0, "retry_on": ["ConnectionError"]},
     "timeout": 2.5, "on_error": "fallback", "fallback": "backup",
     "input_mapping": {"a": "x"}, "output_mapping": {"checked": "ok"}},
    {"flow": "sub_flow", "after": ["load", "check_a"], "on_error": "skip"},
)


def test_every_step_key_loads() -> None:
    loaded = flow_from_data(FULL, "full.flow.json")
    load, check, sub = loaded.steps
    assert loaded.step_ids == ("load", "check_a", "sub_flow")
    assert loaded.dependencies == ((), (), (0, 1))
    assert check.when == "x > 1 and y is None" and check.condition is not None
    assert check.retry == RetryPolicy(4, backoff_seconds=0, retry_on=["ConnectionError"])
    assert (check.timeout, check.on_error, check.fallback) == (2.5, "fallback", "backup")
    assert dict(check.output_mapping) == {"checked": "ok"}
    assert (sub.flow, sub.tool_name, sub.on_error) == ("sub_flow", None, "skip")
    VALIDATOR.validate(FULL)


@pytest.mark.parametrize(("step", "field", "problem"), [
    ({"tool": "t", "flow": "g"}, "steps[0]", "exactly one of 'tool'"),
    ({"id": "x"}, "steps[0]", "exactly one of 'tool'"),
    ({"tool": "t", "after": "a"}, "steps[0].after", "must be a list"),
    ({"tool": "t", "when": "len(x)"}, "steps[0].when", "not allowed"),
    ({"tool": "t", "when": 3}, "steps[0].when", "must be a string"),
    ({"tool": "t", "timeout": "soon"}, "steps[0].timeout", "must be a number"),
    ({"tool": "t", "retry": {"attempts": 3}}, "steps[0].retry.attempts", "unknown key"),
    ({"tool": "t", "retry": {"max_attempts": 0}}, "steps[0].retry", "max_attempts"),
    ({"tool": "t", "on_error": "ignore"}, "steps[0]", "on_error"),
    ({"tool": "t", "output_mapping": {"a": 1}}, "steps[0].output_mapping.a", "string"),
    ({"tool": "t", "after": ["ghost"]}, "steps", "unknown step id 'ghost'"),
])
def test_step_mistakes_name_the_field(step: dict, field: str, problem: str) -> None:
    with pytest.raises(FlowFileError) as caught:
        flow_from_data(flow(step), "bad.flow.json")
    assert caught.value.field == field, caught.value
    assert problem in caught.value.problem
    # Graph errors and the when language are beyond JSON Schema; the reader checks them.
    if field not in ("steps", "steps[0].when") or "string" in problem:
        assert not VALIDATOR.is_valid(flow(step))


def test_a_cycle_and_several_last_steps_are_errors_on_steps() -> None:
    cycle = flow({"tool": "a", "after": ["b"]}, {"tool": "b"})
    with pytest.raises(FlowFileError, match="cycle") as caught:
        flow_from_data(cycle, "cycle.flow.json")
    assert caught.value.field == "steps"
    open_ends = flow({"tool": "a"}, {"tool": "b", "after": []})
    with pytest.raises(FlowFileError, match="output_schema"):
        flow_from_data(open_ends, "ends.flow.json")


def test_the_example_flow_files_follow_the_schema() -> None:
    files = find_flow_files(ROOT / "examples" / "flows")
    assert files
    for path in files:
        if path.suffix == ".json" or _has_yaml():
            VALIDATOR.validate(read_flow_data(path))


def _has_yaml() -> bool:
    try:
        import yaml  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("steps", [
    *[[{"tool": "a", key: None}] for key in
      ("timeout", "id", "when", "after", "retry", "fallback", "flow", "input_mapping")],
    [{"tool": "a", "fallback": "b"}],
    [{"tool": "a", "on_error": "fallback"}],
    [{"tool": "a", "on_error": "skip", "fallback": "b"}],
    [{"tool": "a", "retry": {"retry_on": ["not a class"]}}],
    [{"tool": "a", "retry": {"max_attempts": 101}}],
    [{"tool": "a", "retry": {"backoff_seconds": 1e300, "max_backoff_seconds": 1e300}}],
    ["a b"],
    [{"tool": "a", "id": "p"}, {"tool": "b", "after": ["p", "p"]}],
])
def test_what_the_reader_rejects_the_schema_rejects(steps) -> None:
    data = flow(*steps)
    with pytest.raises(FlowFileError):
        flow_from_data(data, "bad.flow.json")
    assert not VALIDATOR.is_valid(data)


@pytest.mark.parametrize("steps", [
    [{"tool": "a", "retry": {"max_attempts": 2.0}}],
    [{"tool": "a", "on_error": "fallback", "fallback": "b"}],
    [{"tool": "a", "retry": {"max_attempts": 100, "backoff_seconds": 3600,
                             "max_backoff_seconds": 3600}}],
])
def test_what_the_schema_accepts_the_reader_accepts(steps) -> None:
    data = flow(*steps)
    assert VALIDATOR.is_valid(data)
    flow_from_data(data, "good.flow.json")


def test_the_schema_offers_no_null_for_step_keys() -> None:
    schema = flow_file_schema()
    step = schema["$defs"]["StepFormat"]["properties"]
    # A key that takes one of several shapes (requires: a list or a mapping) is an
    # anyOf; none of its shapes may be null.
    assert all(spec.get("default", "") is not None
               and all(shape.get("type") != "null" for shape in spec.get("anyOf", ()))
               for spec in step.values())
    for key in ("requires", "delegations"):
        top = schema["properties"][key]
        assert "default" not in top or top["default"] == []
        assert all(shape.get("type") != "null" for shape in top.get("anyOf", ()))
