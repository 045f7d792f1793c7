"""Flow files: every field is loaded, inline JSON Schema validates and publishes as
written, and every bad input fails with the file, the field and the problem."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from chainweaver import (
    DefinitionError,
    FlowExecutor,
    FlowFileError,
    FlowLifecycle,
    FlowRegistry,
    SideEffectLevel,
    load_flows,
)
from chainweaver.files import find_flow_files, flow_from_data, load_flow_file
from chainweaver.inline_schema import InlineSchemaError, model_from_json_schema
from chainweaver.mcp import FlowServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FLOWS = EXAMPLES / "flows"


@pytest.fixture(scope="module")
def flow_tools() -> Iterator[ModuleType]:
    """examples/flow_tools.py imported the way `--tools examples/flow_tools.py` does."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))
        module = sys.modules.get("flow_tools")
        if module is None:
            spec = importlib.util.spec_from_file_location("flow_tools", EXAMPLES / "flow_tools.py")
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules["flow_tools"] = module
            spec.loader.exec_module(module)
        yield module


@pytest.fixture
def executor(flow_tools: ModuleType) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    for value in vars(flow_tools).values():
        if type(value).__name__ == "Tool":
            executor.register_tool(value)
    return executor


def write(directory: Path, name: str, content: str | dict) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


MINIMAL = {"name": "ping", "description": "Check an order exists.", "steps": ["find_order"]}


# ------------------------------------------------------------------ the examples


def test_example_directory_loads_every_field(executor: FlowExecutor,
                                             flow_tools: ModuleType) -> None:
    flows = {f.name: f for f in load_flows(FLOWS, tools=executor.tools)}
    assert sorted(flows) == ["churn_risk", "help_search", "legacy_ticket", "order_status",
                             "order_total", "refund_order"]

    status = flows["order_status"]
    assert (status.version, status.title) == ("2.0.0", "Order status")
    assert status.description.startswith("Look up an order, ask the carrier")
    assert [s.tool_name for s in status.steps] == ["find_order", "track_parcel",
                                                   "summarise_order"]
    assert status.governance.lifecycle is FlowLifecycle.ACTIVE
    assert status.governance.owner == "support-team"
    assert status.input_schema is flow_tools.OrderQuery  # a model reference
    assert set(status.output_schema.model_fields) == {"order_id", "status", "eta", "summary"}
    (prompt,) = status.prompts
    assert prompt.name == "customer_reply"
    assert [(a.name, a.required) for a in prompt.arguments] == [("order_id", True),
                                                                ("tone", False)]
    assert prompt.messages[0].role == "user"
    assert "{{ order_id }}" in prompt.messages[0].text

    total = flows["order_total"]
    assert dict(total.steps[1].input_mapping) == {"amount_cents": "total_cents",
                                                  "from_currency": "currency"}
    refund = flows["refund_order"]
    assert refund.safety.side_effects is SideEffectLevel.WRITE
    assert refund.safety.requires_approval
    assert refund.safety.approval_reason == "moves money back to the customer"
    assert refund.safety.idempotent is False
    assert flows["churn_risk"].governance.lifecycle is FlowLifecycle.DRAFT
    assert flows["legacy_ticket"].safety is None
    assert flows["help_search"].output_schema is flow_tools.Articles  # from the JSON file


def test_example_flows_run(executor: FlowExecutor) -> None:
    for flow in load_flows(FLOWS, tools=executor.tools):
        executor.registry.register_flow(flow)
    status = executor.execute_flow("order_status", {"order_id": "A-1001"})
    assert status.final_output == {"order_id": "A-1001", "status": "shipped", "eta": "tomorrow",
                                   "summary": "Order A-1001 is shipped; delivery: tomorrow."}
    total = executor.execute_flow("order_total", {"order_id": "A-1003", "to_currency": "EUR"})
    assert total.final_output == {"order_id": "A-1003", "converted_cents": 10471,
                                  "to_currency": "EUR"}
    # The inline input schema's default fills to_currency; the pattern guards order_id.
    assert executor.execute_flow("order_total", {"order_id": "A-1001"}).final_output[
        "to_currency"] == "EUR"
    bad = executor.execute_flow("order_total", {"order_id": "1001"})
    assert not bad.success and bad.error.field == "order_id"
    search = executor.execute_flow("help_search", {"query": "refund"})
    assert search.final_output == {"articles": ["Refund timelines"], "article_ids": ["kb-41"]}


@pytest.mark.anyio
async def test_inline_schemas_are_published_exactly_as_written(executor: FlowExecutor) -> None:
    for flow in load_flows(FLOWS, tools=executor.tools):
        executor.registry.register_flow(flow)
    server = FlowServer(executor, expose_schemas=True)
    written = json.loads((FLOWS / "help_search.flow.json").read_text())["input_schema"]
    async with Client(server.fastmcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
        assert tools["help_search"].input_schema == written
        document = json.loads((await client.read_resource(
            "chainweaver://flows/help_search/schema"))[0].text)
        assert document["input_schema"] == written
        result = await client.call_tool("help_search", {"query": "parcel", "limit": 1})
        assert result.structured_content == {"articles": ["Where is my parcel?"],
                                             "article_ids": ["kb-12"]}
        wrong = await client.call_tool("help_search", {"query": "x"}, raise_on_error=False)
        assert wrong.is_error and "query" in wrong.content[0].text


def test_yaml_and_json_spellings_give_the_same_flow(tmp_path: Path) -> None:
    yaml_file = write(tmp_path, "a.flow.yaml", """
name: ping
version: "1.2"
title: Ping
description: Check an order exists.
governance: {lifecycle: reviewed, owner: ops}
safety: {side_effects: read, open_world: true}
steps:
  - tool: find_order
    input_mapping: {order_id: number}
prompts:
  - name: ask
    arguments: [{name: who, description: Who asks, required: true}]
    messages: [{role: assistant, text: "Hello {{ who }}"}]
""")
    json_file = write(tmp_path, "b.flow.json", {
        "name": "ping", "version": "1.2", "title": "Ping",
        "description": "Check an order exists.",
        "governance": {"lifecycle": "reviewed", "owner": "ops"},
        "safety": {"side_effects": "read", "open_world": True},
        "steps": [{"tool": "find_order", "input_mapping": {"order_id": "number"}}],
        "prompts": [{"name": "ask", "arguments": [{"name": "who", "description": "Who asks",
                                                   "required": True}],
                     "messages": [{"role": "assistant", "text": "Hello {{ who }}"}]}],
    })
    assert load_flow_file(yaml_file) == load_flow_file(json_file)


def test_defaults_of_a_minimal_file(tmp_path: Path) -> None:
    flow = load_flow_file(write(tmp_path, "ping.flow.json", MINIMAL))
    assert flow.version == "1.0.0"
    assert flow.governance.lifecycle is FlowLifecycle.ACTIVE and flow.governance.owner is None
    assert (flow.safety, flow.input_schema, flow.output_schema, flow.prompts) == (
        None, None, None, ())


def test_directories_are_searched_recursively_and_each_file_counts_once(tmp_path: Path) -> None:
    write(tmp_path, "b.flow.yml", "name: b\ndescription: B\nsteps: [find_order]\n")
    write(tmp_path, "nested/a.flow.json", {**MINIMAL, "name": "a"})
    write(tmp_path, "notes.yaml", "not: a flow\n")
    write(tmp_path, "c.json", "{}")
    found = find_flow_files([tmp_path, tmp_path / "b.flow.yml"])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["b.flow.yml",
                                                                  "nested/a.flow.json"]
    assert [f.name for f in load_flows(tmp_path)] == ["b", "a"]


def test_versions_of_one_flow_may_live_in_separate_files(tmp_path: Path) -> None:
    write(tmp_path, "v1.flow.json", {**MINIMAL, "version": "1.0.0"})
    write(tmp_path, "v2.flow.json", {**MINIMAL, "version": "2.0.0"})
    assert sorted(f.version for f in load_flows(tmp_path)) == ["1.0.0", "2.0.0"]


# ------------------------------------------------------------------ inline JSON Schema


SEARCH_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 8},
        "code": {"type": "string", "pattern": "^[A-Z]-[0-9]+$"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        "sort": {"enum": ["relevance", "price", 3]},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1.5},
        "flag": {"type": ["boolean", "null"]},
        "fixed": {"const": "yes"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "filters": {"type": "object", "properties": {"min_price": {"type": "integer"}},
                    "required": ["min_price"], "additionalProperties": False},
        "meta": {"type": "object"},
        "anything": {"description": "no type: any JSON value"},
    },
    "required": ["query"],
}
SEARCH_MODEL = model_from_json_schema(SEARCH_SCHEMA, "SearchInput")
VALIDATOR = jsonschema.Draft202012Validator(SEARCH_SCHEMA)

json_scalars = (st.none() | st.booleans() | st.integers(-3, 60)
                | st.floats(-2, 3, allow_nan=False) | st.text("AZ-0135 abcdéx", max_size=9))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.sampled_from(["min_price", "x"]), inner,
                                             max_size=2), max_leaves=6)
# Valid documents, the same with one property replaced by a value near its boundaries
# (valid or not) or by any JSON value, and arbitrary documents.
VALID = {
    "code": st.sampled_from(["A-1", "Z-22"]),
    "limit": st.integers(1, 50) | st.just(50.0),
    "sort": st.sampled_from(["relevance", "price", 3, 3.0]),
    "ratio": st.floats(0.01, 1.5) | st.just(1),
    "flag": st.booleans() | st.none(),
    "fixed": st.just("yes"),
    "tags": st.lists(st.text("ab", max_size=2), max_size=2),
    "filters": st.fixed_dictionaries({"min_price": st.integers(0, 9) | st.just(3.0)}),
    "meta": st.dictionaries(st.text("ab", max_size=2), json_values, max_size=2),
    "anything": json_values,
}
NEAR = {
    "query": st.text("ab é", max_size=9),
    "code": st.sampled_from(["a-1", "A-", "AA-1", "A-1x", "xA-1"]),
    "limit": st.sampled_from([0, 51, 2.5, True, "3"]),
    "sort": st.sampled_from([True, "x", [3]]),
    "ratio": st.sampled_from([0, 0.0, -1, 1.6, 2, False]),
    "fixed": st.sampled_from(["no", "YES"]),
    "tags": st.lists(st.text("ab", max_size=2), min_size=3, max_size=3),
    "filters": st.sampled_from([{}, {"min_price": 1.5}, {"min_price": 1, "x": 1}]),
    "meta": st.sampled_from([[], "x"]),
}
valid_documents = st.fixed_dictionaries({"query": st.text("ab é", min_size=1, max_size=8)},
                                        optional=VALID)


@st.composite
def mutated(draw: st.DrawFn) -> dict:
    document = draw(valid_documents)
    key = draw(st.sampled_from([*VALID, "query", "other"]))
    document[key] = draw(NEAR.get(key, json_values) | json_values)
    return document


documents = valid_documents | mutated() | st.dictionaries(
    st.sampled_from([*VALID, "query", "other"]), json_values, max_size=5)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents | json_values)
def test_inline_model_accepts_exactly_what_json_schema_accepts(document: object) -> None:
    try:
        SEARCH_MODEL.model_validate(document)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == VALIDATOR.is_valid(document), document


def test_patterns_follow_ecma_262_where_python_re_differs() -> None:
    # JSON Schema patterns are ECMA-262: "$" is the end of the text. Python's re (and so
    # the jsonschema library) also lets it match before a final newline.
    with pytest.raises(ValueError, match="code"):
        SEARCH_MODEL.model_validate({"query": "q", "code": "A-1\n"})
    assert SEARCH_MODEL.model_validate({"query": "q", "code": "A-1"}).code == "A-1"


def test_inline_model_fills_defaults_and_leaves_absent_properties_absent() -> None:
    data = SEARCH_MODEL.model_validate({"query": "shoes", "flag": None, "extra": 1}).model_dump()
    assert data == {"query": "shoes", "limit": 10, "flag": None}
    nested = SEARCH_MODEL.model_validate({"query": "q", "filters": {"min_price": 3.0}})
    assert nested.model_dump()["filters"] == {"min_price": 3}
    assert SEARCH_MODEL.model_json_schema() == SEARCH_SCHEMA


def _accepts(model: type[BaseModel], document: object) -> bool:
    try:
        model.model_validate(document)
    except ValueError:
        return False
    return True


def test_multiples_null_and_structured_enums_follow_json_schema() -> None:
    schema = {"type": "object", "properties": {
        "step": {"type": "number", "multipleOf": 0.5},
        "count": {"type": "integer", "multipleOf": 3},
        "nothing": {"type": "null"},
        "choice": {"enum": [[1, 2], {"a": 1}, "x"]},
    }}
    model = model_from_json_schema(schema, "Mixed")
    validator = jsonschema.Draft202012Validator(schema)
    for document in [{"step": 1.5}, {"step": 1.2}, {"step": 2}, {"count": 9}, {"count": 4},
                     {"count": 6.0}, {"nothing": None}, {"nothing": 0}, {"choice": [1.0, 2]},
                     {"choice": [True, 2]}, {"choice": {"a": 1}}, {"choice": {"a": 1, "b": 2}},
                     {"choice": "x"}, {"choice": ["x"]}, {"choice": [1]}]:
        assert _accepts(model, document) == validator.is_valid(document), document
    # Too large to divide as a float: refused as invalid input, never a crash
    # (the jsonschema library raises OverflowError here).
    assert not _accepts(model, {"step": 10**400})


@pytest.mark.parametrize(("schema", "where", "problem"), [
    ({"type": "object", 1: "x"}, "", "keys must be strings, got 1"),
    ({"type": "object", "required": "a"}, "required", "must be a list of property names"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}},
     "properties.a.pattern", "must be a string"),
    ({"type": "array"}, "type", "must be 'object'"),
    ([], "", "must be a JSON Schema object"),
    ({"type": "object", "$defs": {}}, "$defs", "not supported"),
    ({"type": "object", "properties": {"a": {"type": "string", "minimum": 1}}},
     "properties.a.minimum", "'minimum' is not supported for type 'string'"),
    ({"type": "object", "properties": {"a": {"type": "text"}}}, "properties.a.type",
     "unknown type 'text'"),
    ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}},
     "properties.a.type", "[type, 'null']"),
    ({"type": "object", "properties": {"a": {"type": "string", "enum": ["x", 2]}}},
     "properties.a.enum[1]", "2 does not fit type 'string'"),
    ({"type": "object", "properties": {"a": {"enum": []}}}, "properties.a.enum",
     "non-empty list"),
    ({"type": "object", "properties": {"a": {"type": "integer", "default": "ten"}}},
     "properties.a.default", "does not fit the schema"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}},
     "properties.a.pattern", "look-around"),
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": -1}}},
     "properties.a.minLength", "non-negative integer"),
    ({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0}}},
     "properties.a.multipleOf", "greater than 0"),
    ({"type": "object", "properties": {"a": {"type": "object",
                                             "additionalProperties": {"type": "string"}}}},
     "properties.a.additionalProperties", "true or false"),
    ({"type": "object", "properties": {"a-b": {}}}, "properties.a-b", "identifiers"),
    ({"type": "object", "properties": {"model_x": {}}}, "properties.model_x", "identifiers"),
    ({"type": "object", "properties": {"a": "string"}}, "properties.a", "JSON Schema object"),
    ({"type": "object", "required": ["a"]}, "required", "names 'a'"),
    ({"type": "object", "properties": []}, "properties", "must be an object"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}, "properties.a.$ref",
     "not supported"),
    # Annotations are published as written: a wrong type would break clients.
    ({"type": "object", "properties": {"a": {"type": "string", "examples": 5}}},
     "properties.a.examples", "must be a list of example values, got 5"),
    ({"type": "object", "properties": {"a": {"type": "string", "examples": "A-1"}}},
     "properties.a.examples", "must be a list"),
    ({"type": "object", "title": 3}, "title", "must be a string, got 3"),
    ({"type": "object", "$schema": 5}, "$schema", "must be a string, got 5"),
    ({"type": "object", "$id": 5}, "$id", "must be a string"),
    ({"type": "object", "properties": {"a": {"deprecated": "yes"}}}, "properties.a.deprecated",
     "true or false"),
    ({"type": "object", "$schema": "http://json-schema.org/draft-04/schema#"}, "$schema",
     "must name JSON Schema 2020-12, 2019-09, draft-07 or draft-06"),
    ({"type": "object", "properties": {"a": {"type": "number", "maximum": float("inf")}}},
     "", "must hold JSON values only"),
    ({"type": "object", "enum": [{"a": 1}]}, "enum", "scalar values only"),
    ({"type": "object", "properties": {"p": {"type": "object", "const": {}}}},
     "properties.p.const", "scalar values only"),
])
def test_unsupported_or_invalid_inline_schemas_are_rejected(schema: object, where: str,
                                                            problem: str) -> None:
    with pytest.raises(InlineSchemaError) as raised:
        model_from_json_schema(schema, "Broken")
    assert raised.value.where == where
    assert problem in raised.value.problem
    assert isinstance(raised.value, DefinitionError)


# ------------------------------------------------------------------ bad input


def flow_yaml(body: str) -> str:
    return "name: ping\ndescription: Check an order exists.\n" + body


def json_position(text: str) -> int:
    """The column Python's own JSON parser reports for ``text``'s first error."""
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        return error.colno
    raise AssertionError(f"{text!r} is valid JSON")


# (file name, content, field or None, problem text)
BAD_FILES = [
    ("syntax.flow.yaml", "name: ping\nsteps: [find_order\n", None, "invalid YAML at line 3"),
    # Where the parser places a trailing comma differs between Python releases.
    ("syntax.flow.json", '{"name": "ping",}', None,
     "invalid JSON at line 1, column {}".format(json_position('{"name": "ping",}'))),
    ("dupe.flow.yaml", flow_yaml("steps: [a]\nname: pong\n"), None,
     "invalid YAML at line 4, column 1: duplicate key 'name'"),
    ("dupe.flow.json", '{"name": "a", "name": "b"}', None, "duplicate key 'name'"),
    ("empty.flow.yaml", "", None, "must be a mapping, got null"),
    ("list.flow.json", "[]", None, "must be a mapping, got a list"),
    ("typo.flow.yaml", flow_yaml("stpes: [find_order]\n"), "stpes",
     "unknown key (did you mean 'steps'?"),
    ("extra.flow.yaml", flow_yaml("steps: [find_order]\nauthor: me\n"), "author",
     "unknown key (allowed: name, version, title"),
    ("nosteps.flow.yaml", flow_yaml(""), None, "missing required key 'steps'"),
    ("noname.flow.json", {"description": "x", "steps": ["find_order"]}, None,
     "missing required key 'name'"),
    ("version.flow.yaml", flow_yaml("version: 1.10\nsteps: [find_order]\n"), "version",
     "must be a string (quote it), got a number (1.1)"),
    ("badversion.flow.yaml", flow_yaml("version: banana\nsteps: [find_order]\n"), "version",
     "neither a PEP 440 nor a semver version"),
    ("name.flow.json", {**MINIMAL, "name": "order status"}, "name",
     "flow name 'order status' is invalid"),
    ("title.flow.json", {**MINIMAL, "title": 3}, "title", "must be a string (quote it)"),
    ("steps.flow.yaml", flow_yaml("steps: find_order\n"), "steps", "must be a list"),
    ("nostep.flow.yaml", flow_yaml("steps: []\n"), "steps", "must not be empty"),
    ("steptype.flow.yaml", flow_yaml("steps: [3]\n"), "steps[0]", "must be a mapping"),
    ("stepkey.flow.yaml", flow_yaml("steps: [{tool_name: find_order}]\n"),
     "steps[0].tool_name", "unknown key (did you mean 'tool'?"),
    ("steptool.flow.yaml", flow_yaml("steps: [{tool: 'find order'}]\n"), "steps[0].tool",
     "tool name 'find order' is invalid"),
    ("mapping.flow.yaml", flow_yaml("steps: [{tool: find_order, input_mapping: [a]}]\n"),
     "steps[0].input_mapping", "must be a mapping of tool input field to context key"),
    ("mapvalue.flow.yaml",
     flow_yaml("steps: [{tool: find_order, input_mapping: {order_id: 7}}]\n"),
     "steps[0].input_mapping.order_id", "must be a string"),
    ("lifecycle.flow.yaml", flow_yaml("steps: [find_order]\ngovernance: {lifecycle: live}\n"),
     "governance.lifecycle", "must be one of draft, reviewed, active, archived, got 'live'"),
    ("owner.flow.yaml", flow_yaml("steps: [find_order]\ngovernance: {owner: 42}\n"),
     "governance.owner", "must be a string (quote it), got a number (42)"),
    ("govkey.flow.yaml", flow_yaml("steps: [find_order]\ngovernance: {team: ops}\n"),
     "governance.team", "unknown key"),
    ("effects.flow.yaml", flow_yaml("steps: [find_order]\nsafety: {side_effects: reads}\n"),
     "safety.side_effects", "must be one of none, read, write, external, destructive"),
    ("nosafety.flow.yaml", flow_yaml("steps: [find_order]\nsafety: {open_world: true}\n"),
     "safety", "missing required key 'side_effects'"),
    ("approval.flow.yaml",
     flow_yaml("steps: [find_order]\nsafety: {side_effects: read, requires_approval: 'yes'}\n"),
     "safety.requires_approval", "must be true or false, got a string"),
    ("prompts.flow.yaml", flow_yaml("steps: [find_order]\nprompts: {name: x}\n"), "prompts",
     "must be a list"),
    ("pname.flow.yaml", flow_yaml(
        "steps: [find_order]\nprompts: [{name: Ask, messages: [{role: user, text: hi}]}]\n"),
     "prompts[0]", "prompt name 'Ask' must match"),
    ("role.flow.yaml", flow_yaml(
        "steps: [find_order]\nprompts: [{name: ask, messages: [{role: system, text: hi}]}]\n"),
     "prompts[0].messages[0].role", "must be user or assistant, got 'system'"),
    ("nomsg.flow.yaml", flow_yaml("steps: [find_order]\nprompts: [{name: ask, messages: []}]\n"),
     "prompts[0].messages", "must not be empty"),
    ("placeholder.flow.yaml", flow_yaml(
        "steps: [find_order]\nprompts: [{name: ask, messages: [{role: user, "
        "text: 'Hi {{ who }}'}]}]\n"),
     "prompts[0]", "uses placeholder {{ who }} but declares no argument 'who'"),
    ("argname.flow.yaml", flow_yaml(
        "steps: [find_order]\nprompts: [{name: ask, arguments: [{name: Who}], "
        "messages: [{role: user, text: hi}]}]\n"),
     "prompts[0].arguments[0].name", "prompt argument name 'Who' must match"),
    ("argreq.flow.yaml", flow_yaml(
        "steps: [find_order]\nprompts: [{name: ask, arguments: [{name: who, required: 1}], "
        "messages: [{role: user, text: hi}]}]\n"),
     "prompts[0].arguments[0].required", "must be true or false"),
    ("dupprompt.flow.yaml", flow_yaml(
        "steps: [find_order]\nprompts:\n  - {name: ask, messages: [{role: user, text: a}]}\n"
        "  - {name: ask, messages: [{role: user, text: b}]}\n"),
     "prompts", "duplicate prompt name(s) ask"),
    ("noref.flow.yaml", flow_yaml("steps: [find_order]\ninput_schema: flow_tools.OrderQuery\n"),
     "input_schema", "is not a model reference like 'package.module:ModelName'"),
    ("nomodule.flow.yaml", flow_yaml("steps: [find_order]\ninput_schema: no_such_pkg.models:X\n"),
     "input_schema", "module 'no_such_pkg.models' is not imported"),
    ("noattr.flow.yaml", flow_yaml("steps: [find_order]\noutput_schema: flow_tools:Nope\n"),
     "output_schema", "module 'flow_tools' has no attribute 'Nope'"),
    ("notmodel.flow.yaml", flow_yaml("steps: [find_order]\ninput_schema: flow_tools:find_order\n"),
     "input_schema", "'flow_tools:find_order' is not a pydantic model class"),
    ("schematype.flow.yaml", flow_yaml("steps: [find_order]\ninput_schema: [order_id]\n"),
     "input_schema", "must be a model reference 'package.module:ModelName' or an inline"),
    ("inline.flow.yaml", flow_yaml(
        "steps: [find_order]\ninput_schema:\n  type: object\n  properties:\n"
        "    order_id: {type: string, minLenght: 3}\n"),
     "input_schema.properties.order_id.minLenght", "keyword 'minLenght' is not supported"),
    ("nan.flow.json", '{"name": "ping", "description": "d", "steps": ["find_order"], '
     '"input_schema": {"type": "object", "properties": {"n": {"type": "number", '
     '"maximum": Infinity}}}}', None, "invalid JSON: Infinity is not a JSON value"),
]


@pytest.mark.parametrize(("name", "content", "field", "problem"), BAD_FILES,
                         ids=[case[0] for case in BAD_FILES])
def test_every_bad_file_names_the_file_the_field_and_the_problem(
    tmp_path: Path, flow_tools: ModuleType, name: str, content: str | dict,
    field: str | None, problem: str,
) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(FlowFileError) as raised:
        load_flows(path)
    error = raised.value
    assert (error.path, error.field) == (str(path), field)
    assert problem in error.problem
    prefix = f"{path}: {field}: " if field else f"{path}: "
    assert str(error).startswith(prefix)


@pytest.mark.parametrize(("steps", "field", "problem"), [
    (["find_ordr"], "steps[0].tool", "no tool named 'find_ordr' is registered (did you mean "
     "'find_order'? registered: churn_signals, convert_price"),
    (["find_order", {"tool": "convert_price", "input_mapping": {"amount": "total_cents"}}],
     "steps[1].input_mapping.amount", "tool 'convert_price' has no input field 'amount' "
     "(its fields: amount_cents, from_currency, to_currency)"),
])
def test_steps_are_checked_against_the_registered_tools(
    tmp_path: Path, executor: FlowExecutor, steps: list, field: str, problem: str,
) -> None:
    path = write(tmp_path, "x.flow.json", {**MINIMAL, "steps": steps})
    load_flows(path)  # without tools there is nothing to check them against
    with pytest.raises(FlowFileError) as raised:
        load_flows(path, tools=executor.tools)
    assert raised.value.field == field
    assert raised.value.problem.startswith(problem)


def test_yaml_dates_stay_text(tmp_path: Path, flow_tools: ModuleType) -> None:
    path = write(tmp_path, "dated.flow.yaml", flow_yaml(
        "steps: [find_order]\n"
        "input_schema:\n  type: object\n  properties:\n"
        "    day: {type: string, format: date, examples: [2024-05-01], default: 2024-05-01}\n"))
    [flow] = load_flows(path)
    properties = flow.input_schema.model_json_schema()["properties"]
    # An unquoted date is the text it would be in JSON, not a Python date.
    assert properties["day"]["examples"] == ["2024-05-01"]
    assert properties["day"]["default"] == "2024-05-01"
    # Anchors, aliases and merge keys are refused: tests/core/test_flow_file_limits.py.


def test_yaml_keys_must_be_strings(tmp_path: Path) -> None:
    path = write(tmp_path, "keys.flow.yaml", flow_yaml("steps: [find_order]\n1: one\n"))
    with pytest.raises(FlowFileError, match=r"keys\.flow\.yaml: keys must be strings, got 1"):
        load_flows(path)


def test_a_flow_file_never_imports_the_module_it_references(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A flow file names models; importing a module would run its code, on the word of
    # whoever wrote the file (antigravity opens a browser, this prints to stdout).
    (tmp_path / "side_effect_models.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('x')\n"
        "from pydantic import BaseModel\nclass Query(BaseModel):\n    q: str\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "side_effect_models", raising=False)
    for key, reference in [("input_schema", "side_effect_models:Query"),
                           ("output_schema", "antigravity:Query")]:
        path = write(tmp_path, "x.flow.json", {**MINIMAL, key: reference})
        with pytest.raises(FlowFileError) as raised:
            load_flows(path)
        module = reference.partition(":")[0]
        assert (raised.value.field, raised.value.problem) == (
            key, f"module {module!r} is not imported: a flow file only names what is "
            "already imported (a --tools module, or a module it imports) and never imports "
            "a module itself")
        assert module not in sys.modules
    assert not (tmp_path / "ran").exists()
    # Once the operator's code imported it, the same reference loads.
    monkeypatch.setitem(sys.modules, "side_effect_models",
                        importlib.import_module("side_effect_models"))
    path = write(tmp_path, "x.flow.json", {**MINIMAL, "input_schema": "side_effect_models:Query"})
    [flow] = load_flows(path)
    assert flow.input_schema is sys.modules["side_effect_models"].Query


def test_a_retry_on_path_in_a_flow_file_never_imports_its_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "antigravity", raising=False)
    step = {"tool": "find_order", "retry": {"retry_on": ["antigravity.Busy"]}}
    path = write(tmp_path, "x.flow.json", {**MINIMAL, "steps": [step]})
    with pytest.raises(FlowFileError) as raised:
        load_flows(path)
    assert (raised.value.field, raised.value.problem) == (
        "steps[0].retry.retry_on[0]", "'antigravity.Busy' is not an exception class: module "
        "'antigravity' is not imported: a flow file only names what is already imported "
        "(a --tools module, or a module it imports) and never imports a module itself")
    assert "antigravity" not in sys.modules
    # An exception class of a module that is imported is found without an import.
    step["retry"] = {"retry_on": ["json.JSONDecodeError", "json.decoder:JSONDecodeError"]}
    [flow] = load_flows(write(tmp_path, "x.flow.json", {**MINIMAL, "steps": [step]}))
    assert flow.steps[0].retry is not None


def test_the_same_flow_version_in_two_files_is_an_error(tmp_path: Path) -> None:
    first = write(tmp_path, "a.flow.json", {**MINIMAL, "version": "1.0"})
    second = write(tmp_path, "b.flow.yaml", flow_yaml("version: 1.0.0\nsteps: [find_order]\n"))
    with pytest.raises(FlowFileError) as raised:
        load_flows(tmp_path)
    assert str(raised.value) == (f"{second}: version: flow 'ping' version '1.0.0' is already "
                                 f"defined in {first}")


def test_missing_paths_and_empty_directories(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.flow\.yaml: no such file or directory"):
        load_flows(tmp_path / "nope.flow.yaml")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty: no \*\.flow\.yaml, \*\.flow\.yml or "):
        load_flows(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_flow_file(tmp_path / "gone.flow.json")


def test_files_named_directly_need_a_yaml_or_json_suffix_and_utf8(tmp_path: Path) -> None:
    text = write(tmp_path, "flow.txt", "name: x")
    with pytest.raises(FlowFileError, match="unsupported file type: use .yaml, .yml or .json"):
        load_flows(text)
    binary = tmp_path / "bad.flow.json"
    binary.write_bytes(b'{"name": "\xff"}')
    with pytest.raises(FlowFileError, match="is not UTF-8 text"):
        load_flows(binary)


def test_yaml_without_pyyaml_says_how_to_install_it_and_json_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` fail
    yaml_file = write(tmp_path, "a.flow.yaml", flow_yaml("steps: [find_order]\n"))
    with pytest.raises(ModuleNotFoundError) as raised:
        load_flows(yaml_file)
    assert "pip install -e '.[yaml]' in a clone of ChainWeaver" in str(raised.value)
    assert raised.value.name == "yaml"
    json_file = write(tmp_path, "b.flow.json", MINIMAL)
    assert [f.name for f in load_flows(json_file)] == ["ping"]


def test_flow_from_data_builds_from_parsed_content() -> None:
    flow = flow_from_data({**MINIMAL, "input_schema": {"type": "object", "properties": {
        "order_id": {"type": "string"}}, "required": ["order_id"]}})
    assert issubclass(flow.input_schema, BaseModel)
    assert flow.input_schema.__name__ == "PingInput"
    with pytest.raises(FlowFileError, match=r"^<data>: name: must be a string"):
        flow_from_data({**MINIMAL, "name": None})


def test_multiple_of_an_integer_step_is_exact_for_huge_floats() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 3}}}
    model = model_from_json_schema(schema, "Thirds")
    validator = jsonschema.Draft202012Validator(schema)
    for document in [{"x": 1e308}, {"x": 9.0}, {"x": 9}, {"x": 10}, {"x": 4.5}]:
        assert _accepts(model, document) == validator.is_valid(document), document
