"""Rendering prompts: string arguments in, literal and labelled messages out.

Three kinds of prompt are rendered here: the schema-derived invocation prompt of
each exposed flow, prompts authored with ``FlowPrompt``, and the guide. Rendering
never runs a flow or calls a tool. Every caller mistake raises
``fastmcp.exceptions.ValidationError`` (JSON-RPC -32602) naming the prompt and the
argument, logged below DEBUG with no traceback at any usual level (see
:mod:`.mistakes`): it is the caller's, and its message may quote the caller's value.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jsonschema
import pydantic
from fastmcp.exceptions import ValidationError

from chainweaver.mcp.components.mistakes import invalid_request
from chainweaver.mcp.publish.contract import (
    ArgumentSpec,
    PublishedContract,
    argument_specs,
    property_kind,
    property_schema,
    show_value,
)
from chainweaver.mcp.publish.exposure import ExposedFlow
from chainweaver.prompts import (
    NOT_XML_TEXT,
    USER_DATA_NOTICE,
    FlowPrompt,
    PromptMessage,
    label_user_data,
    seal_json,
)
from chainweaver.schemas import example_value

# JSON's number spellings (ASCII digits only; Python's int() and float() would also
# take "1_000" and other scripts' digits).
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def invalid(prompt: str, message: str) -> ValidationError:
    return invalid_request(f"Prompt {prompt!r}: {message}")


# --------------------------------------------------------------- arguments


def argument_choices(spec: ArgumentSpec) -> list[str]:
    """Completion candidates for one argument: enum values, booleans or examples."""
    prop = spec.schema
    if prop.get("enum"):
        return [show_value(v) for v in prop["enum"]]
    if property_kind(prop) == "boolean":
        return ["true", "false"]
    return [show_value(v) for v in prop.get("examples", [])]


def _convert(prompt: str, name: str, text: str, prop: Mapping[str, Any]) -> Any:
    kind = property_kind(prop)
    if prop.get("enum"):
        for allowed in prop["enum"]:
            if show_value(allowed) == text:
                return allowed
        allowed = ", ".join(show_value(v) for v in prop["enum"])
        raise invalid(prompt, f"argument {name!r} must be one of: {allowed}")
    if kind == "string":
        return text
    if kind == "integer":
        try:
            if not _INTEGER.fullmatch(text.strip()):  # no "1_000", no non-ASCII digits
                raise ValueError(text)
            return int(text.strip())
        except ValueError:  # also more digits than Python converts (4,300)
            raise invalid(prompt, f"argument {name!r} must be an integer") from None
    if kind == "number":
        spelled = text.strip()
        if _NUMBER.fullmatch(spelled):
            number = float(spelled)
        elif spelled.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            number = math.nan
        else:
            raise invalid(prompt, f"argument {name!r} must be a number")
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
            value = _json_value(text)
        except ValueError as error:
            raise invalid(prompt, f"argument {name!r} must be JSON text ({kind}): "
                                  f"{error}") from None
        expected = list if kind == "array" else dict
        if not isinstance(value, expected):
            raise invalid(prompt, f"argument {name!r} must be a JSON {kind}")
        return value
    # Unions and untyped fields: the JSON reading of the text when the property takes
    # it (or nothing does), else the text itself.
    try:
        value = _json_value(text)
    except ValueError:  # not JSON, too deep, NaN / Infinity or out of range
        return text
    if _fits(value, prop) or not _fits(text, prop):
        return value
    return text


MAX_JSON_DEPTH = 64


def _json_value(text: str) -> Any:
    """Decode JSON text that is finite and at most ``MAX_JSON_DEPTH`` levels deep.

    Deeper text is refused before decoding: rendering (and the validation after it)
    walks the value recursively, and must never hit the interpreter's recursion limit.
    Raises ValueError for anything else it refuses.
    """
    if _nesting(text) > MAX_JSON_DEPTH:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def _nesting(text: str) -> int:
    """The deepest bracket nesting of JSON text, ignoring brackets inside strings."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


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


def check_argument_names(
    prompt: str, values: Mapping[str, Any] | None, known: Mapping[str, bool]
) -> dict[str, str]:
    """Reject unknown, missing-required and non-string arguments. ``known``: name -> required."""
    values = dict(values or {})
    for name, value in values.items():
        if name not in known:
            raise invalid(prompt, f"unknown argument {name!r}")
        if not isinstance(value, str):
            raise invalid(prompt, f"argument {name!r} must be a string, got "
                                  f"{type(value).__name__}")
        if not _encodable(value):
            # A lone surrogate ("\\ud800" in the request's JSON) cannot be sent back.
            raise invalid(prompt, f"argument {name!r} is not valid Unicode text")
    for name, required in known.items():
        if required and name not in values:
            raise invalid(prompt, f"missing required argument {name!r}")
    return values


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@lru_cache(maxsize=1024)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def tool_arguments(
    prompt: str, contract: PublishedContract, values: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Convert string values to the schema's types and fill defaults, then check the
    result with the flow's own input model: the same check ``tools/call`` runs."""
    strings = check_argument_names(prompt, values, contract.required_arguments)
    arguments: dict[str, Any] = {}
    for spec in contract.arguments:
        if spec.name in strings:
            value = _convert(prompt, spec.name, strings[spec.name], spec.schema)
            if not _encodable(json.dumps(value, ensure_ascii=False)):
                raise invalid(prompt, f"argument {spec.name!r} is not valid Unicode text")
            arguments[spec.name] = value
        elif spec.name in contract.defaults:
            arguments[spec.name] = contract.defaults[spec.name]
    try:
        contract.input_model.model_validate(arguments)
    except pydantic.ValidationError as error:
        raise invalid(prompt, _misfit(error, arguments)) from None
    except Exception as error:  # a validator of the flow's model that raises otherwise:
        # still the caller's value it refused, but its text is the author's (never shown)
        logging.getLogger("chainweaver.mcp.components.prompts").debug(
            "prompt %r: the input model raised %s", prompt, type(error).__name__)
        raise invalid(prompt, "the flow's input model refused the arguments") from None
    return arguments


def _misfit(error: pydantic.ValidationError, arguments: Mapping[str, Any]) -> str:
    first = error.errors(include_url=False, include_input=False)[0]
    location = list(first.get("loc", ()))
    if not location:
        return f"arguments do not fit the flow's input schema: {first['msg']}"
    inner = _value_path(arguments.get(str(location[0])), location[1:])
    where = f" at {inner}" if inner else ""
    return (f"argument {str(location[0])!r} does not fit the flow's input schema{where}: "
            f"{first['msg']}")


def _value_path(value: Any, location: list[Any]) -> str:
    """The part of a pydantic error location that names keys and indexes of ``value``.

    Pydantic puts union member tags (``Node``, ``list[str]``) into locations too;
    those name nothing the caller wrote, so they are left out.
    """
    path = []
    for position, part in enumerate(location):
        last = position == len(location) - 1
        if isinstance(value, Mapping) and (part in value or (last and isinstance(part, str))):
            path.append(str(part))
            value = value.get(part)
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            path.append(str(part))
            value = value[part]
    return ".".join(path)


def example_tool_arguments(schema: Mapping[str, Any]) -> dict[str, str]:
    """Prompt argument strings for every required argument, from examples or valid values."""
    values = {}
    for spec in argument_specs(schema):
        if spec.required:
            value = example_value(schema["properties"][spec.name], dict(schema))
            values[spec.name] = value if isinstance(value, str) else json.dumps(value)
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
        prop = property_schema(raw, output_schema)
        kind = property_kind(prop) or "value"
        about = f": {prop['description']}" if prop.get("description") else ""
        lines.append(f"- {name} ({kind}){about}")
    return lines


def invocation_messages(
    exposed: ExposedFlow, arguments: Mapping[str, Any]
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
        *_output_lines(exposed.contract.output_schema),
    ]
    if exposed.schema_uri:
        lines.append(f"The full input/output contract is in the resource {exposed.schema_uri}.")
    lines += ["", USER_DATA_NOTICE, label_user_data("arguments", seal_json(arguments_json))]
    return [PromptMessage("user", "\n".join(lines))]


def authored_messages(
    published_name: str, prompt: FlowPrompt, values: Mapping[str, Any] | None
) -> list[PromptMessage]:
    """An author's prompt with its placeholders filled literally."""
    known = {argument.name: argument.required for argument in prompt.arguments}
    strings = check_argument_names(published_name, values, known)
    for name, value in strings.items():
        control = NOT_XML_TEXT.search(value)
        if control is not None:
            # XML cannot carry it, not even as a reference: the section would not decode
            # back to the value, so refuse rather than show something else.
            raise invalid(published_name, f"argument {name!r} contains the control "
                                          f"character U+{ord(control.group()):04X}")
    return prompt.render(strings)


def guide_messages(flows: list[ExposedFlow]) -> list[PromptMessage]:
    """The guide: every flow of ``flows`` (one caller's view) and when to choose it."""
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
