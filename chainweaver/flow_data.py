"""Parsed flow-file content (a mapping from YAML or JSON) turned into a :class:`Flow`.

Every problem raises :class:`FlowFileError` naming the file, the field (``steps[1].tool``)
and what is wrong. Unknown and duplicate keys are errors, never ignored. Reading and finding
the files is :mod:`chainweaver.files`; see docs/flow-files.md for the format.
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel

from .errors import DefinitionError, FlowFileError
from .flow_format import (
    DEFAULT_LIMITS,
    DelegationFormat,
    FlowFileFormat,
    FlowFileLimits,
    GovernanceFormat,
    GrantsFormat,
    PromptArgumentFormat,
    PromptFormat,
    PromptMessageFormat,
    RetryFormat,
    SafetyFormat,
    StepFormat,
    keys,
)
from .flows import (
    TASK_MODES,
    Flow,
    FlowGovernance,
    FlowLifecycle,
    FlowStep,
)
from .grants import Delegation, Grants
from .inline_schema import InlineSchemaError, model_from_json_schema
from .mappings import Const, MappingSource, Pointer
from .prompts import FlowPrompt, PromptArgument, PromptMessage, repeated_names
from .retry import CLASS_PATH_PATTERN, RetryPolicy, exception_class, imported_attribute
from .safety import SideEffectLevel, ToolSafetyContract
from .tools import check_model, check_name
from .versions import version_key

# The keys of each part come from the format models (which also give the JSON Schema).
FLOW_KEYS = keys(FlowFileFormat)
STEP_KEYS = keys(StepFormat)
RETRY_KEYS = keys(RetryFormat)
GOVERNANCE_KEYS = keys(GovernanceFormat)
SAFETY_KEYS = keys(SafetyFormat)
GRANTS_KEYS = keys(GrantsFormat)
DELEGATION_KEYS = keys(DelegationFormat)
PROMPT_KEYS = keys(PromptFormat)
ARGUMENT_KEYS = keys(PromptArgumentFormat)
MESSAGE_KEYS = keys(PromptMessageFormat)


# ------------------------------------------------------------------ typed fields


_KINDS = {type(None): "null", bool: "a boolean", str: "a string", list: "a list",
          dict: "a mapping"}


def _kind(value: Any) -> str:
    """A value's type in the words of the file formats."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"a number ({_show(value)})"
    return _KINDS.get(type(value), f"a {type(value).__name__}")


def _show(value: Any, width: int = 80) -> str:
    """``repr(value)``, shortened; never fails (an int past Python's digit limit cannot
    be printed at all)."""
    try:
        text = repr(value)
    except Exception:
        return f"<a {type(value).__name__} too large to print>"
    return text if len(text) <= width else f"{text[:width - 3]}..."


def check_limits(data: Any, path: str | os.PathLike = "<data>",
                 limits: FlowFileLimits = DEFAULT_LIMITS) -> None:
    """Raise :class:`FlowFileError` naming the field when ``data`` is over ``limits``:
    nested too deeply, a string too long, an integer with too many digits, a number
    that is not finite. Iterative, so no input can exhaust the stack."""
    f = _Fields(Path(path))
    largest = 10 ** limits.max_number_length
    stack: list[tuple[Any, str | None, int]] = [(data, None, 1)]
    while stack:
        value, field, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limits.max_depth:
                raise f.error(field, f"nested more than {limits.max_depth} levels deep "
                              "(limit max_depth)")
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_scalar(f, key, field, limits, largest)
                    here = _join(field, key) if isinstance(key, str) else field
                    stack.append((item, here, depth + 1))
            else:
                stack.extend((item, f"{field or ''}[{index}]", depth + 1)
                             for index, item in enumerate(value))
        else:
            _check_scalar(f, value, field, limits, largest)


def _check_scalar(f: _Fields, value: Any, field: str | None,
                        limits: FlowFileLimits, largest: int) -> None:
    if isinstance(value, str):
        if len(value) > limits.max_string_length:
            raise f.error(field, f"a string of {len(value)} characters is longer than "
                          f"{limits.max_string_length} (limit max_string_length)")
    elif isinstance(value, bool):
        return
    elif isinstance(value, int):
        if not -largest < value < largest:
            raise f.error(field, f"an integer with more than {limits.max_number_length} "
                          "digits (limit max_number_length)")
    elif isinstance(value, float) and not math.isfinite(value):
        raise f.error(field, f"must be a finite number, got {value!r}")


class _Fields:
    """Typed access to one file's values; every failure names the file and field."""

    def __init__(self, path: Path, imports: bool = False) -> None:
        self.path = path
        self.imports = imports  # may a model or exception reference import its module

    def error(self, field: str | None, problem: str) -> FlowFileError:
        return FlowFileError(self.path, field, problem)

    def mapping(self, value: Any, field: str | None, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(field, f"must be a mapping, got {_kind(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.error(field, f"keys must be strings, got {_show(key)}")
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise self.error(_join(field, key), f"unknown key ({hint}allowed: "
                                 f"{', '.join(allowed)})")
        for key in required:
            if key not in value:
                raise self.error(field, f"missing required key {key!r}")
        return value

    def string(self, value: Any, field: str, *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            hint = " (quote it)" if isinstance(value, (int, float, bool)) else ""
            raise self.error(field, f"must be a string{hint}, got {_kind(value)}")
        return value

    def boolean(self, value: Any, field: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(field, f"must be true or false, got {_kind(value)}")
        return value

    def items(self, value: Any, field: str, *, non_empty: bool = False) -> list[Any]:
        if not isinstance(value, list):
            raise self.error(field, f"must be a list, got {_kind(value)}")
        if non_empty and not value:
            raise self.error(field, "must not be empty")
        return value

    def choice(self, value: Any, field: str, enum: type[Enum]) -> Any:
        choices = [member.value for member in enum]
        if value not in choices or not isinstance(value, str):
            raise self.error(field, f"must be one of {', '.join(choices)}, "
                             f"got {_show(value)}")
        return enum(value)

    @contextmanager
    def core(self, field: str | None) -> Iterator[None]:
        """Turn a core definition error (bad name, version, prompt) into a file error."""
        try:
            yield
        except DefinitionError as error:
            raise self.error(field, str(error)) from None


def _join(field: str | None, key: str) -> str:
    return f"{field}.{key}" if field else key


# ------------------------------------------------------------------ flow parts


def _string_map(f: _Fields, value: Any, field: str, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise f.error(field, f"must be a mapping of {what}, got {_kind(value)}")
    for key, item in value.items():
        f.string(key, field)
        f.string(item, f"{field}.{key}")
    return value


def _input_mapping(f: _Fields, value: Any, field: str) -> dict[str, MappingSource]:
    """Tool input field -> context key, ``{pointer: /a/b}`` or ``{const: value}``."""
    if not isinstance(value, dict):
        raise f.error(field, "must be a mapping of tool input field to context key, "
                      f"{{pointer: /path}} or {{const: value}}, got {_kind(value)}")
    mapping: dict[str, MappingSource] = {}
    for key, item in value.items():
        f.string(key, field)
        here = f"{field}.{key}"
        if isinstance(item, str):
            mapping[key] = item
            continue
        if not isinstance(item, dict) or len(item) != 1 or not {"const", "pointer"} & set(item):
            raise f.error(here, "must be a string (a context key), {pointer: /path} (a JSON "
                          "pointer into the context) or {const: value} (a constant), got "
                          f"{_kind(item)}")
        if "const" in item:
            with f.core(f"{here}.const"):
                mapping[key] = Const(item["const"])
            continue
        path = f.string(item["pointer"], f"{here}.pointer")
        with f.core(f"{here}.pointer"):
            mapping[key] = Pointer(path)
    return mapping


def _number(f: _Fields, value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise f.error(field, f"must be a number, got {_kind(value)}")
    return value


def _retry(f: _Fields, value: Any, field: str) -> RetryPolicy:
    data = f.mapping(value, field, RETRY_KEYS)
    options: dict[str, Any] = {}
    for key in ("max_attempts", "backoff_seconds", "max_backoff_seconds", "jitter"):
        if key in data:
            options[key] = _number(f, data[key], f"{field}.{key}")
    if isinstance(options.get("max_attempts"), float) and options["max_attempts"].is_integer():
        # JSON Schema's integer includes 2.0, and so does this reader.
        options["max_attempts"] = int(options["max_attempts"])
    if "retry_on" in data:
        options["retry_on"] = []
        for index, item in enumerate(f.items(data["retry_on"], f"{field}.retry_on")):
            here = f"{field}.retry_on[{index}]"
            try:
                exception_class(f.string(item, here), imports=f.imports)
            except ValueError as error:
                raise f.error(here, str(error)) from None
            options["retry_on"].append(item)
    with f.core(field):
        return RetryPolicy(**options)


def _step(f: _Fields, item: Any, field: str) -> FlowStep:
    data = f.mapping(item, field, STEP_KEYS)
    if ("tool" in data) == ("flow" in data):
        raise f.error(field, "needs exactly one of 'tool' (a tool name) or 'flow' (a "
                      "registered flow run as one step)")
    options: dict[str, Any] = {}
    if "requires" in data:
        options["requires"] = _requires(f, data["requires"], f"{field}.requires")
    for key in ("id", "when", "on_error", "fallback", "flow"):
        if key in data:
            options[key] = f.string(data[key], f"{field}.{key}")
    if "after" in data:
        options["after"] = [f.string(step_id, f"{field}.after")
                            for step_id in f.items(data["after"], f"{field}.after")]
    if "timeout" in data:
        options["timeout"] = _number(f, data["timeout"], f"{field}.timeout")
    if "retry" in data:
        options["retry"] = _retry(f, data["retry"], f"{field}.retry")
    mapping = _input_mapping(f, data.get("input_mapping", {}), f"{field}.input_mapping")
    options["output_mapping"] = _string_map(f, data.get("output_mapping", {}),
                                            f"{field}.output_mapping",
                                            "context key to output field")
    tool = f.string(data["tool"], f"{field}.tool") if "tool" in data else None
    where = f"{field}.tool" if tool is not None else f"{field}.flow"
    if "when" in data:
        with f.core(f"{field}.when"):
            FlowStep(tool, when=options["when"], flow=options.get("flow"))
    with f.core(where if set(options) <= {"flow", "output_mapping", "requires"} else field):
        return FlowStep(tool, mapping, **options)


def _steps(f: _Fields, value: Any) -> list[FlowStep]:
    steps = []
    for index, item in enumerate(f.items(value, "steps", non_empty=True)):
        field = f"steps[{index}]"
        if isinstance(item, str):  # shorthand: just the tool name
            with f.core(field):
                steps.append(FlowStep(item))
            continue
        steps.append(_step(f, item, field))
    return steps


def _requires(f: _Fields, value: Any, field: str) -> Grants | None:
    """A list of scopes, or a mapping with ``scopes`` and ``claims``."""
    if isinstance(value, list):
        scopes = [f.string(item, field) for item in value]
        with f.core(field):
            return Grants.of(scopes, field)
    if not isinstance(value, dict):
        raise f.error(field, f"must be a list of scopes or a mapping with scopes and "
                      f"claims, got {_kind(value)}")
    data = f.mapping(value, field, GRANTS_KEYS)
    scopes = [f.string(item, f"{field}.scopes")
              for item in f.items(data.get("scopes", []), f"{field}.scopes")]
    claims = data.get("claims", {})
    if not isinstance(claims, dict):
        raise f.error(f"{field}.claims", f"must be a mapping of claim names to accepted "
                      f"values, got {_kind(claims)}")
    with f.core(field):
        return Grants.of({"scopes": scopes, "claims": claims}, field)


def _delegations(f: _Fields, value: Any) -> list[Delegation]:
    result = []
    for index, item in enumerate(f.items(value, "delegations")):
        here = f"delegations[{index}]"
        data = f.mapping(item, here, DELEGATION_KEYS, required=("step", "reason"))
        with f.core(here):
            result.append(Delegation(f.string(data["step"], f"{here}.step"),
                                     f.string(data["reason"], f"{here}.reason")))
    return result


def _governance(f: _Fields, value: Any) -> FlowGovernance:
    if value is None:
        return FlowGovernance()
    data = f.mapping(value, "governance", GOVERNANCE_KEYS)
    lifecycle = f.choice(data.get("lifecycle", "active"), "governance.lifecycle",
                         FlowLifecycle)
    owner = f.string(data.get("owner"), "governance.owner", optional=True)
    publish = f.boolean(data.get("publish", True), "governance.publish")
    return FlowGovernance(lifecycle, owner, publish)


def _safety(f: _Fields, value: Any) -> ToolSafetyContract | None:
    if value is None:
        return None
    data = f.mapping(value, "safety", SAFETY_KEYS, required=("side_effects",))
    options: dict[str, Any] = {
        "side_effects": f.choice(data["side_effects"], "safety.side_effects",
                                 SideEffectLevel),
        "approval_reason": f.string(data.get("approval_reason"), "safety.approval_reason",
                                    optional=True),
    }
    for key in ("idempotent", "requires_approval", "open_world"):
        if key in data and not (key == "idempotent" and data[key] is None):  # null: default
            options[key] = f.boolean(data[key], f"safety.{key}")
    return ToolSafetyContract(**options)


def import_model(reference: str, *, imports: bool = True) -> type[BaseModel]:
    """The pydantic model class ``"package.module:ModelName"``; ValueError says what is wrong.

    With ``imports=False`` (what flow files get) the module must already be imported:
    a flow file names a model, it never makes anyone import a module."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute \
            or not re.fullmatch(CLASS_PATH_PATTERN, reference):
        raise ValueError(f"{_show(reference)} is not a model reference like "
                         "'package.module:ModelName'")
    if not imports:
        target = imported_attribute(reference)
    else:
        try:
            target = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            raise ValueError(f"cannot import module {module_name!r}: {error}") from None
        except Exception as error:  # the module's own code failed while importing
            raise ValueError(f"importing module {module_name!r} failed: "
                             f"{type(error).__name__}: {error}") from None
        for part in attribute.split("."):
            if not hasattr(target, part):
                raise ValueError(f"module {module_name!r} has no attribute {attribute!r}")
            target = getattr(target, part)
    if not (isinstance(target, type) and issubclass(target, BaseModel)):
        raise ValueError(f"{reference!r} is not a pydantic model class")
    return target


def _schema(f: _Fields, value: Any, field: str, model_name: str) -> type[BaseModel] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            model = import_model(value, imports=f.imports)
        except ValueError as error:
            raise f.error(field, str(error)) from None
        with f.core(field):
            check_model("model reference", field, model)
        return model
    if isinstance(value, dict):
        try:
            return model_from_json_schema(value, model_name)
        except InlineSchemaError as error:
            raise f.error(_join(field, error.where) if error.where else field,
                          error.problem) from None
    raise f.error(field, "must be a model reference 'package.module:ModelName' or an "
                  f"inline JSON Schema mapping, got {_kind(value)}")


def _prompt_arguments(f: _Fields, value: Any, field: str) -> list[PromptArgument]:
    arguments = []
    for index, item in enumerate(f.items(value, field)):
        here = f"{field}[{index}]"
        data = f.mapping(item, here, ARGUMENT_KEYS, required=("name",))
        name = f.string(data["name"], f"{here}.name")
        description = f.string(data.get("description", ""), f"{here}.description")
        required = f.boolean(data.get("required", False), f"{here}.required")
        with f.core(f"{here}.name"):
            arguments.append(PromptArgument(name, description, required))
    return arguments


def _prompt_messages(f: _Fields, value: Any, field: str) -> list[PromptMessage]:
    messages = []
    for index, item in enumerate(f.items(value, field, non_empty=True)):
        here = f"{field}[{index}]"
        data = f.mapping(item, here, MESSAGE_KEYS, required=("role", "text"))
        role = f.string(data["role"], f"{here}.role")
        if role not in ("user", "assistant"):
            raise f.error(f"{here}.role", f"must be user or assistant, got {role!r}")
        messages.append(PromptMessage(role, f.string(data["text"], f"{here}.text")))
    return messages


def _prompts(f: _Fields, value: Any) -> list[FlowPrompt]:
    prompts = []
    for index, item in enumerate(f.items(value, "prompts")):
        field = f"prompts[{index}]"
        data = f.mapping(item, field, PROMPT_KEYS, required=("name", "messages"))
        name = f.string(data["name"], f"{field}.name")
        title = f.string(data.get("title"), f"{field}.title", optional=True)
        description = f.string(data.get("description", ""), f"{field}.description")
        arguments = _prompt_arguments(f, data.get("arguments", []), f"{field}.arguments")
        messages = _prompt_messages(f, data["messages"], f"{field}.messages")
        with f.core(field):  # placeholders and duplicate arguments are checked here
            prompts.append(FlowPrompt(name, title, description, arguments, messages))
    return prompts


def _task_mode(f: _Fields, value: Any) -> str | None:
    if value not in TASK_MODES:  # null too: an optional key is left out, never null
        raise f.error("task_mode", f"must be one of {', '.join(TASK_MODES)}, "
                      f"got {_show(value)}")
    return cast("str | None", value)


def _model_base_name(flow_name: str) -> str:
    parts = flow_name.replace("-", "_").replace(".", "_").split("_")
    return "".join(part.capitalize() for part in parts if part) or "Flow"


def flow_from_data(data: Any, path: str | os.PathLike = "<data>", *,
                   limits: FlowFileLimits = DEFAULT_LIMITS, imports: bool = False) -> Flow:
    """Build a :class:`Flow` from parsed file content; ``path`` is used in errors.

    ``data`` is first checked against ``limits`` (see :class:`FlowFileLimits`). Model
    references and ``retry_on`` paths name things in modules already imported (the
    tools modules and what they import); nothing is imported unless ``imports=True``."""
    check_limits(data, path, limits)
    f = _Fields(Path(path), imports)
    top = f.mapping(data, None, FLOW_KEYS, required=("name", "description", "steps"))
    name = f.string(top["name"], "name")
    with f.core("name"):
        check_name("flow", name)
    version = f.string(top.get("version", "1.0.0"), "version")
    with f.core("version"):
        version_key(version)
    base = _model_base_name(name)
    parts = {
        "title": f.string(top.get("title"), "title", optional=True),
        "description": f.string(top["description"], "description"),
        "steps": _steps(f, top["steps"]),
        "governance": _governance(f, top.get("governance")),
        "safety": _safety(f, top.get("safety")),
        "input_schema": _schema(f, top.get("input_schema"), "input_schema", f"{base}Input"),
        "output_schema": _schema(f, top.get("output_schema"), "output_schema",
                                 f"{base}Output"),
        "task_mode": _task_mode(f, top["task_mode"]) if "task_mode" in top else None,
        "requires": (_requires(f, top["requires"], "requires") if "requires" in top
                     else None),
        "delegations": _delegations(f, top.get("delegations", [])),
    }
    prompts = _prompts(f, top.get("prompts", []))
    duplicates = repeated_names(p.name for p in prompts)
    if duplicates:
        raise f.error("prompts", f"duplicate prompt name(s) {', '.join(duplicates)}")
    with f.core("steps"):  # ids, after, cycles, several last steps: checked by Flow
        return Flow(name=name, version=version, prompts=prompts, **parts)
