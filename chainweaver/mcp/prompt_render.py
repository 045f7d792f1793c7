"""Rendering prompts: string arguments in, literal and labelled messages out.

Three kinds of prompt are rendered here: the schema-derived invocation prompt of
each exposed flow, prompts authored with ``FlowPrompt``, and the guide. Rendering
never runs a flow or calls a tool. Every caller mistake raises
``fastmcp.exceptions.ValidationError`` (JSON-RPC -32602) naming the prompt and the
argument, logged at DEBUG only, because the message may quote the caller's value.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

import jsonschema
from fastmcp.exceptions import ValidationError

from ..prompts import USER_DATA_NOTICE, FlowPrompt, PromptMessage, label_user_data
from ..schemas import example_value, resolve_property
from .exposure import ExposedFlow, Exposure

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def invalid(prompt: str, message: str) -> ValidationError:
    return ValidationError(f"Prompt {prompt!r}: {message}", log_level=logging.DEBUG)


# --------------------------------------------------------------- arguments


def _property(raw: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    """A property schema with refs and nullable wrappers removed.

    A union of several non-null types (``int | str``) stays a union: reading it as
    its first branch would reject values the schema accepts.
    """
    branches = raw.get("anyOf")
    if isinstance(branches, list) and len(_union_types(raw)) != 1:
        return dict(raw)
    return resolve_property(dict(raw), dict(root))


def _union_types(prop: Mapping[str, Any]) -> list[str]:
    """The non-null branch types of an ``anyOf``; a ``$ref`` branch is a model, an object."""
    return [str(b.get("type", "object" if "$ref" in b or "properties" in b else "value"))
            for b in prop.get("anyOf", ()) if isinstance(b, Mapping) and b.get("type") != "null"]


def _kind(prop: Mapping[str, Any]) -> str | None:
    kind = prop.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    if kind is None and "enum" in prop:
        return "enum"
    return kind


def describe_property(prop: Mapping[str, Any]) -> str:
    """One line for a prompt argument: description, type, allowed values, default, examples."""
    parts = []
    if prop.get("description"):
        parts.append(str(prop["description"]).rstrip("."))
    kind = _kind(prop)
    if kind and kind != "enum":
        parts.append(f"Type: {kind}" + (" (JSON text)" if kind in ("array", "object") else ""))
    elif kind is None and _union_types(prop):
        parts.append("Type: " + " or ".join(dict.fromkeys(_union_types(prop))))
    if prop.get("enum"):
        parts.append("Allowed values: " + ", ".join(_show(v) for v in prop["enum"]))
    if "default" in prop:
        parts.append(f"Default: {_show(prop['default'])}")
    if prop.get("examples"):
        parts.append("Examples: " + ", ".join(_show(v) for v in prop["examples"][:3]))
    return ". ".join(parts) + "." if parts else ""


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def argument_specs(schema: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(name, description, required) for each top-level property of an input schema."""
    required = set(schema.get("required", ()))
    specs = []
    for name, raw in schema.get("properties", {}).items():
        prop = _property(raw, schema)
        specs.append((name, describe_property(prop), name in required and "default" not in prop))
    return specs


def argument_choices(schema: Mapping[str, Any], name: str) -> list[str]:
    """Completion candidates for one argument: enum values, booleans or examples."""
    raw = schema.get("properties", {}).get(name)
    if raw is None:
        return []
    prop = _property(raw, schema)
    if prop.get("enum"):
        return [_show(v) for v in prop["enum"]]
    if _kind(prop) == "boolean":
        return ["true", "false"]
    return [_show(v) for v in prop.get("examples", [])]


def _convert(prompt: str, name: str, text: str, prop: Mapping[str, Any]) -> Any:
    kind = _kind(prop)
    if prop.get("enum"):
        for allowed in prop["enum"]:
            if _show(allowed) == text:
                return allowed
        allowed = ", ".join(_show(v) for v in prop["enum"])
        raise invalid(prompt, f"argument {name!r} must be one of: {allowed}")
    if kind == "string":
        return text
    if kind == "integer":
        try:
            return int(text.strip())
        except ValueError:
            raise invalid(prompt, f"argument {name!r} must be an integer") from None
    if kind == "number":
        try:
            number = float(text.strip())
        except ValueError:
            raise invalid(prompt, f"argument {name!r} must be a number") from None
        if not math.isfinite(number):
            raise invalid(prompt, f"argument {name!r} must be a finite number")
        return int(number) if number.is_integer() and "." not in text else number
    if kind == "boolean":
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise invalid(prompt, f"argument {name!r} must be true or false")
    if kind in ("array", "object"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise invalid(prompt, f"argument {name!r} must be JSON text ({kind})") from None
        expected = list if kind == "array" else dict
        if not isinstance(value, expected):
            raise invalid(prompt, f"argument {name!r} must be a JSON {kind}")
        return value
    # Unions and untyped fields: the JSON reading of the text when the property takes
    # it (or nothing does), else the text itself.
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except ValueError:  # JSONDecodeError, or NaN / Infinity
        return text
    if _fits(value, prop) or not _fits(text, prop):
        return value
    return text


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e400" parses as inf, which JSON cannot carry
        raise ValueError(f"{text} is out of range")
    return value


def _fits(value: Any, prop: Mapping[str, Any]) -> bool:
    try:
        return _validator(json.dumps(prop, sort_keys=True)).is_valid(value)
    except Exception:  # a property we cannot check alone (an unresolved $ref): the
        return True  # validation of the whole arguments object decides


# Argument name -> JSON type name of the values a ``prompts/get`` sent that were not
# strings. The MCP SDK would refuse them before FastMCP runs, with a message naming
# nothing; ``NonStringPromptArguments`` blanks them so the request passes the gate,
# and the check below answers like for any other caller mistake.
NON_STRING_ARGUMENTS: ContextVar[Mapping[str, str] | None] = ContextVar(
    "chainweaver_non_string_prompt_arguments", default=None
)


def check_argument_names(
    prompt: str, values: Mapping[str, Any] | None, known: Mapping[str, bool]
) -> dict[str, str]:
    """Reject unknown, missing-required and non-string arguments. ``known``: name -> required."""
    values = dict(values or {})
    non_string = NON_STRING_ARGUMENTS.get() or {}
    for name, value in values.items():
        if name not in known:
            raise invalid(prompt, f"unknown argument {name!r}")
        if name in non_string or not isinstance(value, str):
            kind = non_string.get(name) or type(value).__name__
            raise invalid(prompt, f"argument {name!r} must be a string, got {kind}")
    for name, required in known.items():
        if required and name not in values:
            raise invalid(prompt, f"missing required argument {name!r}")
    return values


@lru_cache(maxsize=1024)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


# id(schema) -> (schema, argument name -> required, validator). Published schemas are
# long-lived cached dicts; keeping a reference to each stops its id being reused.
_PREPARED: dict[int, tuple[Mapping[str, Any], dict[str, bool],
                           jsonschema.protocols.Validator]] = {}


def _prepared(schema: Mapping[str, Any]) -> tuple[dict[str, bool],
                                                   jsonschema.protocols.Validator]:
    """What every render of a schema needs, computed once per schema object."""
    entry = _PREPARED.get(id(schema))
    if entry is None or entry[0] is not schema:
        known = {name: required for name, _, required in argument_specs(schema)}
        entry = (schema, known, _validator(json.dumps(schema, sort_keys=True)))
        if len(_PREPARED) >= 4096:  # callers passing fresh dicts must not grow it forever
            _PREPARED.clear()
        _PREPARED[id(schema)] = entry
    return entry[1], entry[2]


def tool_arguments(
    prompt: str, schema: Mapping[str, Any], values: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Convert string values to the schema's types, fill defaults, validate with jsonschema."""
    known, validator = _prepared(schema)
    strings = check_argument_names(prompt, values, known)
    properties = schema.get("properties", {})
    arguments: dict[str, Any] = {}
    for name in properties:
        prop = _property(properties[name], schema)
        if name in strings:
            arguments[name] = _convert(prompt, name, strings[name], prop)
        elif "default" in prop:
            arguments[name] = prop["default"]
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        # absolute_path: inside anyOf/oneOf, best_match picks a sub-error whose own
        # path is relative to the union, not to the arguments object.
        where = str(error.absolute_path[0]) if error.absolute_path else None
        if where is None and error.validator == "required":
            where = str(error.message).split("'")[1] if "'" in error.message else None
        label = f"argument {where!r}" if where else "arguments"
        raise invalid(prompt, f"{label} does not fit the flow's input schema: {error.message}")
    return arguments


def example_tool_arguments(schema: Mapping[str, Any]) -> dict[str, str]:
    """Prompt argument strings for every required argument, from examples or valid values."""
    values = {}
    for name, _, required in argument_specs(schema):
        if required:
            value = example_value(schema["properties"][name], dict(schema))
            values[name] = value if isinstance(value, str) else json.dumps(value)
    return values


# --------------------------------------------------------------- messages


def _safety_lines(exposed: ExposedFlow) -> list[str]:
    safety = exposed.safety
    if safety is None:
        return ["Safety: unknown. Treat this tool as able to change or delete data, and "
                "confirm with the user before calling it."]
    if safety.read_only:
        lines = ["Safety: read-only. It does not change anything."]
    else:
        lines = [f"Safety: NOT read-only. Its side effects are '{safety.side_effects.value}'."]
    if safety.requires_approval:
        reason = f" ({safety.approval_reason})" if safety.approval_reason else ""
        lines.append(f"Approval: required{reason}. Ask the user to approve before calling it.")
    else:
        lines.append("Approval: not required.")
    return lines


def _output_lines(output_schema: Mapping[str, Any] | None) -> list[str]:
    if not output_schema or not output_schema.get("properties"):
        return ["The result is the flow's JSON output."]
    lines = ["The result will contain:"]
    for name, raw in output_schema["properties"].items():
        prop = _property(raw, output_schema)
        kind = _kind(prop) or "value"
        about = f": {prop['description']}" if prop.get("description") else ""
        lines.append(f"- {name} ({kind}){about}")
    return lines


def invocation_messages(
    exposed: ExposedFlow,
    output_schema: Mapping[str, Any] | None,
    arguments: Mapping[str, Any],
) -> list[PromptMessage]:
    """The schema-derived prompt: how to call the flow's tool with these arguments."""
    flow = exposed.flow
    arguments_json = json.dumps(arguments, indent=2, ensure_ascii=False, sort_keys=True)
    lines = [
        f"Call the tool `{exposed.tool_name}` ({flow.display_title}, flow version "
        f"{flow.version}).",
        "",
        f"What it does: {flow.description}",
        "It is one deterministic tool call: the flow runs its steps in order, validating "
        "the data between them, with no model in the loop.",
        *_safety_lines(exposed),
        "",
        f"Pass exactly the JSON object in the user-data section named 'arguments' as the "
        f"arguments of `{exposed.tool_name}`.",
        *_output_lines(output_schema),
    ]
    if exposed.schema_uri:
        lines.append(f"The full input/output contract is in the resource {exposed.schema_uri}.")
    lines += ["", USER_DATA_NOTICE, label_user_data("arguments", arguments_json)]
    return [PromptMessage("user", "\n".join(lines))]


def authored_messages(
    published_name: str, prompt: FlowPrompt, values: Mapping[str, Any] | None
) -> list[PromptMessage]:
    """An author's prompt with its placeholders filled literally."""
    known = {argument.name: argument.required for argument in prompt.arguments}
    strings = check_argument_names(published_name, values, known)
    return prompt.render(strings)


def guide_messages(exposure: Exposure) -> list[PromptMessage]:
    """The guide: every exposed flow and when to choose it. Never mentions others."""
    flows = exposure.exposed_flows
    if not flows:
        return [PromptMessage("user", "This server publishes no flows right now.")]
    lines = [
        "This server publishes deterministic flows as tools. Each flow is ONE tool call: "
        "it runs fixed steps with validation between them and returns structured output.",
        "Choose the flow whose description matches the task; prefer read-only flows when "
        "they are enough.",
        "",
    ]
    for exposed in flows:
        safety = exposed.safety
        kind = ("read-only" if safety and safety.read_only else
                f"side effects: {safety.side_effects.value}" if safety else "safety unknown")
        if safety and safety.requires_approval:
            kind += ", needs approval"
        lines.append(f"- `{exposed.tool_name}` ({exposed.flow.display_title}; {kind}): "
                     f"{exposed.flow.description}")
        if exposed.schema_uri:
            lines.append(f"  Schema: {exposed.schema_uri}")
        if exposed.invocation_prompt:
            lines.append(f"  Prompt: {exposed.invocation_prompt}")
    return [PromptMessage("user", "\n".join(lines))]
