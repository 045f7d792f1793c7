"""Flow files are held to FlowFileLimits while they are read: a hostile file (an alias
bomb, deep nesting, a huge number or string, a huge file) is a FlowFileError naming the
file and the line, never a RecursionError, a ValueError or seconds of work, in YAML and
JSON alike, through load_flows, the watcher and flow_from_data."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from chainweaver import FlowExecutor, FlowFileError, FlowRegistry, tool
from chainweaver.files import (
    DEFAULT_LIMITS,
    FlowFileLimits,
    flow_from_data,
    load_flow_file,
    load_flows,
    load_flows_by_file,
    read_flow_data,
)
from chainweaver.flow_format import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NUMBER_LENGTH,
    MAX_STRING_LENGTH,
)
from chainweaver.watch import FlowFileWatcher

HEAD_YAML = "name: ping\ndescription: d\nsteps: [echo]\n"
HEAD_JSON = '{"name": "ping", "description": "d", "steps": ["echo"]'
HYPOTHESIS = settings(max_examples=60, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


@tool
def echo(text: str) -> dict:
    """Echo."""
    return {"text": text}


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def refused(path: Path, limits: FlowFileLimits = DEFAULT_LIMITS) -> FlowFileError:
    """The FlowFileError loading ``path`` raises; nothing else may escape."""
    with pytest.raises(FlowFileError) as raised:
        load_flows(path, limits=limits)
    error = raised.value
    assert error.path == str(path)
    assert str(error).startswith(f"{path}: ")
    assert "\n" not in str(error)
    return error


def line_of(error: FlowFileError) -> int:
    match = re.search(r"at line (\d+), column \d+", error.problem)
    assert match, error.problem
    return int(match.group(1))


# ------------------------------------------------------------------ the limits


def test_the_defaults_are_the_documented_constants() -> None:
    assert DEFAULT_LIMITS == FlowFileLimits()
    assert (DEFAULT_LIMITS.max_bytes, DEFAULT_LIMITS.max_depth,
            DEFAULT_LIMITS.max_string_length, DEFAULT_LIMITS.max_number_length) == (
        MAX_FILE_BYTES, MAX_DEPTH, MAX_STRING_LENGTH, MAX_NUMBER_LENGTH)
    assert (MAX_FILE_BYTES, MAX_DEPTH, MAX_STRING_LENGTH, MAX_NUMBER_LENGTH) == (
        1_048_576, 64, 65_536, 100)


@pytest.mark.parametrize("field", ["max_bytes", "max_depth", "max_string_length",
                                   "max_number_length"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10", None])
def test_limits_must_be_positive_integers(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"FlowFileLimits.{field} must be a positive"):
        FlowFileLimits(**{field: value})


# ------------------------------------------------------------------ YAML aliases


def alias_bomb(levels: int) -> str:
    """The billion-laughs shape: each level is ten aliases of the one before."""
    lines = [HEAD_YAML, "input_schema:\n  type: object\n", '  examples: &l0 ["lol"]\n']
    for level in range(1, levels + 1):
        aliases = ", ".join([f"*l{level - 1}"] * 10)
        lines.append(f"  x{level}: &l{level} [{aliases}]\n")
    return "".join(lines)


@pytest.mark.parametrize("levels", [1, 3, 9])
def test_an_alias_bomb_is_refused_at_once_naming_the_line(tmp_path: Path,
                                                          levels: int) -> None:
    path = write(tmp_path, "bomb.flow.yaml", alias_bomb(levels))
    assert path.stat().st_size < 1000  # a small file that would expand to 10**levels
    started = time.perf_counter()
    error = refused(path)
    assert time.perf_counter() - started < 1
    assert error.field is None
    assert line_of(error) == 6  # the first anchor, before anything is expanded
    assert "anchors and aliases" in error.problem


@pytest.mark.parametrize("body", [
    "input_schema: &s {type: object}\noutput_schema: *s\n",
    "input_schema:\n  type: object\n  properties:\n    a: &t {type: string}\n"
    "    b: {<<: *t, description: B}\n",
    "title: &t Ping\n",  # an anchor alone already multiplies nothing, but is refused too
    "governance: &g\n  owner: ops\n",
])
def test_anchors_aliases_and_merge_keys_are_refused(tmp_path: Path, body: str) -> None:
    error = refused(write(tmp_path, "alias.flow.yaml", HEAD_YAML + body))
    assert "anchors and aliases" in error.problem
    assert line_of(error) >= 4


# ------------------------------------------------------------------ nesting


def nested_yaml(depth: int, kinds: list[str], block: bool) -> str:
    """``x:`` holding ``depth - 1`` nested containers (the top mapping is level 1)."""
    value = "0"
    for level in range(depth - 1):
        kind = kinds[level % len(kinds)]
        value = f"[{value}]" if kind == "list" else f"{{k: {value}}}"
    if block:
        return HEAD_YAML + "x: " + value + "\n"
    return "{" + HEAD_YAML.replace("\n", ", ").rstrip(", ") + ", x: " + value + "}\n"


def nested_json(depth: int, kinds: list[str]) -> str:
    value = "0"
    for level in range(depth - 1):
        kind = kinds[level % len(kinds)]
        value = f"[{value}]" if kind == "list" else f'{{"k": {value}}}'
    return HEAD_JSON + ', "x": ' + value + "}"


# Depths around every max_depth tried and well past it; past the recursion limit:
# test_nesting_past_the_recursion_limit_is_a_file_error.
@HYPOTHESIS
@given(depth=st.integers(2, 300), kinds=st.lists(st.sampled_from(["list", "map"]),
                                                   min_size=1, max_size=8),
       suffix=st.sampled_from([".flow.yaml", ".flow.json", ".flow.yaml#flow"]),
       max_depth=st.sampled_from([3, 10, MAX_DEPTH]))
def test_nesting_is_refused_past_max_depth_in_yaml_and_json(
        tmp_path: Path, depth: int, kinds: list[str], suffix: str, max_depth: int) -> None:
    if suffix == ".flow.json":
        text = nested_json(depth, kinds)
    else:
        text = nested_yaml(depth, kinds, block=not suffix.endswith("#flow"))
    path = write(tmp_path, "deep" + suffix.split("#")[0], text)
    limits = FlowFileLimits(max_depth=max_depth)
    if depth <= max_depth:
        assert read_flow_data(path, limits)["x"] is not None
        with pytest.raises(FlowFileError, match="x: unknown key"):  # read, then judged
            load_flows(path, limits=limits)
    else:
        error = refused(path, limits)
        assert f"nested more than {max_depth} levels deep (limit max_depth)" in error.problem
        assert line_of(error) >= 1


@pytest.mark.parametrize("suffix", [".flow.yaml", ".flow.json"])
@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_nesting_past_the_recursion_limit_is_a_file_error(tmp_path: Path, suffix: str,
                                                          depth: int) -> None:
    # Without the limit: RecursionError from the YAML composer or the json module.
    text = (nested_json(depth, ["list"]) if suffix.endswith("json")
            else nested_yaml(depth, ["list"], block=True))
    error = refused(write(tmp_path, "deep" + suffix, text))
    assert "limit max_depth" in error.problem


def nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_an_inline_schema_nested_up_to_the_limit_loads_and_publishes(tmp_path: Path) -> None:
    # top (1) > input_schema (2) > properties (3) > a (4) > ... : 31 object levels fit.
    data = {"name": "ping", "description": "d", "steps": ["echo"],
            "input_schema": nested_schema(31)}
    [flow] = load_flows(write(tmp_path, "ok.flow.json", json.dumps(data)))
    assert flow.input_schema is not None
    json.dumps(flow.input_schema.model_json_schema())
    data["input_schema"] = nested_schema(32)
    refused(write(tmp_path, "ok.flow.json", json.dumps(data)))


# ------------------------------------------------------------------ numbers


@pytest.mark.parametrize(("yaml_value", "json_value"), [
    ("9" * 5000, "9" * 5000),  # past Python's int digit limit: ValueError without limits
    ("-" + "1" * 101, "-" + "1" * 101),
    ("0x" + "f" * 5000, None),  # no digit limit in power-of-two bases
    ("0b" + "1" * 200, None),
    ("1" + "_0" * 60, None),
    ("1." + "5" * 200, "1." + "5" * 200),
    ("1.0e+400", "1e400"),  # not finite
    ("-1.0e+999", "-1E999"),
])
@pytest.mark.parametrize("field", ["version", "description", "input_schema_max"])
def test_numbers_too_long_or_too_large_are_refused_naming_the_line(
        tmp_path: Path, yaml_value: str, json_value: str | None, field: str) -> None:
    for suffix, value in ((".flow.yaml", yaml_value), (".flow.json", json_value)):
        if value is None:
            continue
        if suffix == ".flow.yaml":
            text = ("name: ping\nsteps: [echo]\n" + (
                "description: d\ninput_schema:\n  type: object\n  properties:\n"
                f"    n: {{type: number, maximum: {value}}}\n"
                if field == "input_schema_max" else
                f"description: d\nversion: {value}\n" if field == "version"
                else f"description: {value}\n"))
        else:
            text = ('{"name": "ping", "steps": ["echo"],\n' + (
                '"description": "d", "input_schema": {"type": "object", "properties":\n'
                f'{{"n": {{"type": "number", "maximum": {value}}}}}}}}}'
                if field == "input_schema_max" else
                f'"description": "d",\n"version": {value}}}' if field == "version"
                else f'"description": {value}}}'))
        path = write(tmp_path, "number" + suffix, text)
        error = refused(path)
        assert ("limit max_number_length" in error.problem
                or "not a finite number" in error.problem), error.problem
        assert line_of(error) >= 2


@HYPOTHESIS
@given(digits=st.integers(1, 300), negative=st.booleans())
def test_integers_load_exactly_up_to_max_number_length(tmp_path: Path, digits: int,
                                                       negative: bool) -> None:
    number = ("-" if negative else "") + "7" * digits
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 0}}}
    in_json = json.dumps(schema).replace(": 0", f": {number}")
    for suffix, text in ((".flow.yaml", f"{HEAD_YAML}input_schema:\n  type: object\n"
                          f"  properties:\n    n: {{type: integer, maximum: {number}}}\n"),
                         (".flow.json", f'{HEAD_JSON}, "input_schema": {in_json}}}')):
        path = write(tmp_path, "n" + suffix, text)
        if len(number) <= MAX_NUMBER_LENGTH:
            [flow] = load_flows(path)
            assert flow.input_schema is not None
        else:
            assert "limit max_number_length" in refused(path).problem


# ------------------------------------------------------------------ strings and size


@pytest.mark.parametrize("suffix", [".flow.yaml", ".flow.json"])
def test_strings_load_up_to_max_string_length(tmp_path: Path, suffix: str) -> None:
    limits = FlowFileLimits(max_string_length=50)
    for length, fits in ((50, True), (51, False), (5000, False)):
        text = "a" * length
        content = (f"{HEAD_YAML}title: {text}\n" if suffix == ".flow.yaml"
                   else HEAD_JSON + f', "title": "{text}"}}')
        path = write(tmp_path, "s" + suffix, content)
        if fits:
            assert load_flow_file(path, limits=limits).title == text
        else:
            error = refused(path, limits)
            assert f"a string of {length} characters is longer than 50" in error.problem
            assert line_of(error) == (4 if suffix == ".flow.yaml" else 1)


def test_long_keys_and_escaped_json_strings_are_measured_as_text(tmp_path: Path) -> None:
    limits = FlowFileLimits(max_string_length=12)  # "description" is 11
    # Thirteen characters written as 78: measured as thirteen, so refused; six fit.
    assert "13 characters" in refused(write(
        tmp_path, "e.flow.json", HEAD_JSON + ', "title": "' + "\\u0041" * 13 + '"}'),
        limits).problem
    assert load_flow_file(write(tmp_path, "e.flow.json", HEAD_JSON + ', "title": "'
                                + "\\u0041" * 6 + '"}'), limits=limits).title == "AAAAAA"
    assert "limit max_string_length" in refused(write(
        tmp_path, "k.flow.yaml", HEAD_YAML + "k" * 13 + ": 1\n"), limits).problem


@pytest.mark.parametrize("suffix", [".flow.yaml", ".flow.json"])
def test_a_file_over_max_bytes_is_refused_before_it_is_parsed(tmp_path: Path,
                                                              suffix: str) -> None:
    filler = "#" + "x" * 2_000_000 + "\n" if suffix == ".flow.yaml" else " " * 2_000_000
    text = (HEAD_YAML + filler) if suffix == ".flow.yaml" else (HEAD_JSON + filler + "}")
    error = refused(write(tmp_path, "big" + suffix, text))
    assert error.problem == "is larger than 1048576 bytes (limit max_bytes)"
    small = FlowFileLimits(max_bytes=len(HEAD_YAML))
    path = write(tmp_path, "exact.flow.yaml", HEAD_YAML)
    assert load_flow_file(path, limits=small).name == "ping"
    path.write_text(HEAD_YAML + "\n")
    assert "limit max_bytes" in refused(path, small).problem


# ------------------------------------------------------------------ any data


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers() | st.builds(lambda n: 10 ** n, st.integers(0, 6000))
    | st.text(max_size=20) | st.builds(lambda n: "x" * n, st.integers(60_000, 70_000)),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["type", "properties", "a", "items", "default",
                                       "examples", "maximum", "steps", "tool"]),
                      children, max_size=3),
    max_leaves=12,
)


def deep(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


@HYPOTHESIS
@given(field=st.sampled_from(["name", "version", "title", "description", "steps",
                              "input_schema", "output_schema", "governance", "safety",
                              "prompts", "task_mode", 12]),
       value=json_values | st.builds(deep, json_values, st.integers(0, 5000)))
def test_flow_from_data_raises_only_flow_file_errors(field: Any, value: Any) -> None:
    data = {"name": "ping", "description": "d", "steps": ["echo"], field: value}
    try:
        flow_from_data(data, "hostile.flow.json")
    except FlowFileError as error:
        assert error.path == "hostile.flow.json"
        str(error)  # printable: no int too long to convert


@pytest.mark.parametrize(("value", "field", "problem"), [
    (deep("x", 100), "x" + "[0]" * 63, "nested more than 64 levels deep"),
    (10 ** 100, "x", "an integer with more than 100 digits"),
    (-(10 ** 5000), "x", "an integer with more than 100 digits"),
    (float("inf"), "x", "must be a finite number, got inf"),
    ("y" * 70_000, "x", "a string of 70000 characters is longer than 65536"),
], ids=["deep", "digits", "digits-past-python-limit", "infinity", "long-string"])
def test_flow_from_data_names_the_field_over_a_limit(value: Any, field: str,
                                                     problem: str) -> None:
    with pytest.raises(FlowFileError) as raised:
        flow_from_data({"name": "ping", "description": "d", "steps": ["echo"], "x": value})
    assert raised.value.field == field
    assert problem in raised.value.problem


def test_a_huge_integer_where_a_string_belongs_is_described_not_printed() -> None:
    for field in ("version", "name", "title"):
        with pytest.raises(FlowFileError, match=f"{field}: .*limit max_number_length"):
            flow_from_data({"name": "ping", "description": "d", "steps": ["echo"],
                            field: 10 ** 5000})
    # Within limits the usual error, with the number shown.
    with pytest.raises(FlowFileError, match=r"version: must be a string \(quote it\), got "
                       r"a number \(12\)"):
        flow_from_data({"name": "ping", "description": "d", "steps": ["echo"],
                        "version": 12})


# ------------------------------------------------------------------ the watcher


HOSTILE = {
    "bomb.flow.yaml": alias_bomb(9),
    "deep.flow.yaml": nested_yaml(50_000, ["list"], block=True),
    "deep.flow.json": nested_json(50_000, ["map"]),
    "version.flow.yaml": "name: ping\nversion: " + "1" * 5000 + "\ndescription: d\n"
                         "steps: [echo]\n",
    "version.flow.json": '{"name": "ping", "version": ' + "1" * 5000
                         + ', "description": "d", "steps": ["echo"]}',
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_watcher_marks_a_hostile_edit_stale_and_keeps_serving(tmp_path: Path,
                                                                  name: str) -> None:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    good = write(tmp_path, name, HEAD_YAML if name.endswith(".yaml") else HEAD_JSON + "}")
    loaded = load_flows_by_file(tmp_path, tools=executor.tools)
    for flow in loaded.values():
        executor.registry.register_flow(flow)
    watcher = FlowFileWatcher(executor.registry, tmp_path, tools=executor.tools,
                              loaded=loaded)
    before = executor.registry.state()
    good.write_text(HOSTILE[name])
    assert watcher.check() is False  # no exception, nothing applied
    assert executor.registry.state() is before
    assert list(watcher.stale) == [str(good)]
    assert watcher.stale[str(good)].startswith(f"{good}: ")
    assert "at line" in watcher.stale[str(good)]
    assert watcher.stale_flows() == {"ping": watcher.stale[str(good)]}


# ------------------------------------------------------------------ flows that stall


def test_a_flow_has_at_most_max_steps_steps(tmp_path: Path) -> None:
    # Checking a flow's graph grows with the square of its steps: a 1 MiB file of
    # 30,000 steps took minutes to load. Past MAX_STEPS it is refused at once.
    from chainweaver import DefinitionError, Flow, FlowStep
    from chainweaver.flow_format import flow_file_schema
    from chainweaver.flows import MAX_STEPS

    assert MAX_STEPS == 1000
    steps = [FlowStep("echo", id=f"s{i}") for i in range(MAX_STEPS)]
    assert len(Flow("big", "d", steps).steps) == MAX_STEPS
    with pytest.raises(DefinitionError, match=r"^flow 'big' has 1001 steps, more than 1000 "
                       r"\(MAX_STEPS\): split it into sub-flows$"):
        Flow("big", "d", [*steps, FlowStep("echo", id="one_more")])
    path = tmp_path / "big.flow.json"
    path.write_text(json.dumps({"name": "big", "description": "d",
                                "steps": [{"tool": "echo", "id": f"s{i}"}
                                          for i in range(30_000)]}))
    with pytest.raises(FlowFileError) as raised:
        load_flows(path)
    assert raised.value.field == "steps" and "30000 steps, more than 1000" in str(raised.value)
    assert flow_file_schema()["properties"]["steps"]["maxItems"] == MAX_STEPS


class Made(BaseModel):
    value: int


def test_steps_that_all_write_one_key_at_once_are_one_problem_each() -> None:
    from chainweaver import Flow, FlowStep

    @tool
    def make(x: int) -> Made:
        return Made(value=x)

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(make)
    flow = Flow("wide", "d", [FlowStep("make", id=f"s{i}", after=()) for i in range(200)],
                output_schema=Made)
    problems = [p for p in executor.flow_problems(flow) if p.kind == "ConflictingWritesError"]
    # Each step after the first is reported once (with the first step it races),
    # not once per pair (19,900 lines).
    assert [p.step_id for p in problems] == [f"s{i}" for i in range(1, 200)]
    assert problems[0].message.startswith("steps 's0' and 's1' may run at the same time")


def test_yaml_is_read_by_libyaml_when_it_is_installed(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # PyYAML's pure Python reader takes seconds for a file near max_bytes; with libyaml
    # the limits are checked on its events and the pure reader is only asked for errors.
    yaml = pytest.importorskip("yaml")
    if not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("PyYAML without libyaml: the pure Python reader is all there is")
    text = (HEAD_YAML + "input_schema:\n  type: object\n  examples: [2024-05-01, 1e5, "
            "'x', 0x1f, .5, null, ~, yes, {a: [1, 2]}]\n")
    path = tmp_path / "fast.flow.yaml"
    path.write_text(text)
    expected = read_flow_data(path)
    assert expected["input_schema"]["examples"] == [
        "2024-05-01", "1e5", "x", 31, 0.5, None, None, True, {"a": [1, 2]}]

    def no_pure_reader(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pure Python composer ran")

    monkeypatch.setattr(yaml.SafeLoader, "compose_node", no_pure_reader)
    assert read_flow_data(path) == expected
    for problem in ("a: &x 1\nb: *x\n", f"deep: {'[' * 70}{']' * 70}\n",
                    "big: 1.0e+400\n", f"long: {'x' * 70000}\n"):
        bad = tmp_path / "bad.flow.yaml"
        bad.write_text(HEAD_YAML + problem)
        with pytest.raises(FlowFileError, match="not allowed|over a limit"):
            read_flow_data(bad)
