"""Static checks of constants and JSON pointers, and showing a flow clean without a plan.

- :func:`pointer_problem`: whether a JSON pointer can find anything in a value of a
  given model's field, by the model's JSON Schema (a key an object does not have, an
  index into an object, anything inside a string...).
- :func:`constant_problem`: whether a constant fits the field it feeds.
- :func:`clean_input_model` (and :func:`clean_needs_approval`): showing, without
  compiling it, that :func:`~chainweaver.plan.compile_plan` would find no problem in a
  flow (see "Clean without a plan", below).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, TypeAdapter, ValidationError

from .flow_input import derived_input_model
from .flows import Flow, FlowStep
from .mappings import (
    ComputedSource,
    Const,
    Pointer,
    describe,
    is_index,
    list_index,
    pointer_text,
)
from .schemas import field_annotation, model_json_schema, resolve_property
from .tools import Tool


class Producer(Protocol):
    """What the checks read of an earlier planned step (``plan.PlannedStep``)."""

    id: str
    output_mapping: Any
    output_model: type[BaseModel] | None
    fallback: Any


# (kind, message, field): a problem the plan records for the step being checked.
Finding = tuple[str, str, str]

_SCALAR_TYPES = ("string", "integer", "number", "boolean", "null")


def constant_problem(model: type[BaseModel], name: str, const: Const) -> str | None:
    """Why ``const`` cannot feed field ``name`` of ``model`` (None: it fits)."""
    try:
        TypeAdapter(field_annotation(model, name)).validate_python(const.value)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where + ': ' if where else ''}{first['msg']}"
    except Exception:  # a type pydantic cannot adapt on its own: the run decides
        return None
    return None


def _json_types(schema: Any, root: dict[str, Any], depth: int = 0) -> frozenset[str] | None:
    """The JSON types a property schema accepts (None: any, or not known here)."""
    if not isinstance(schema, Mapping) or depth > 16:
        return None
    if "$ref" in schema or ("allOf" in schema and len(schema["allOf"]) == 1):
        schema = resolve_property(dict(schema), root) if "anyOf" not in schema else schema
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset([kind])
    if isinstance(kind, list):
        return frozenset(kind)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            branches = [_json_types(branch, root, depth + 1) for branch in schema[key]]
            if any(branch is None for branch in branches):
                return None
            return frozenset().union(*branches)  # type: ignore[arg-type]
    values = schema["enum"] if isinstance(schema.get("enum"), list) \
        else [schema["const"]] if "const" in schema else None
    if values is None:
        return None
    return frozenset(_VALUE_TYPES.get(type(value), "object") for value in values)


_VALUE_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean",
                type(None): "null", list: "array", dict: "object"}


def input_type_problem(flow_model: type[BaseModel], key: str, model: type[BaseModel],
                       name: str) -> str | None:
    """Why a value of the flow input's field ``key`` can fail field ``name`` of
    ``model`` that it feeds as is (None: every such value has a type the field takes).
    By JSON type (an integer fits a number), and an optional input field without a
    default feeding a required field; constraints are left to the run."""
    try:
        flow_root, root = model_json_schema(flow_model), model_json_schema(model)
    except Exception:  # an unpublishable model: nothing to compare
        return None
    given = _json_types(flow_root.get("properties", {}).get(key), flow_root)
    taken = _json_types(root.get("properties", {}).get(name), root)
    if given is None or taken is None:
        return None
    accepted = taken | {"integer"} if "number" in taken else taken
    if not given <= accepted:
        return (f"the flow input's {key!r} may be {' or '.join(sorted(given - accepted))}, "
                f"which the field (of type {' or '.join(sorted(taken))}) does not take")
    wanted = model.model_fields.get(name)
    offered = flow_model.model_fields.get(key)
    if wanted is not None and offered is not None and wanted.is_required() \
            and not offered.is_required() and offered.default is None \
            and "null" not in taken:
        return (f"the flow input's {key!r} is optional without a default, and the field "
                "is required")
    return None


def pointer_problem(model: type[BaseModel], name: str, pointer: Pointer) -> str | None:
    """Why ``pointer`` (whose root is field ``name`` of ``model``) can never find a value
    there, by the model's JSON Schema (None: it may)."""
    try:
        root = model_json_schema(model)
    except Exception:  # an unpublishable model: nothing to check against
        return None
    current: Any = root.get("properties", {}).get(name)
    if current is None:
        return None  # the field is not in the schema (an alias?): unknown
    tokens = pointer.tokens
    for depth in range(1, len(tokens)):
        current = resolve_property(dict(current), root)
        branches = [b for b in current.get("anyOf", current.get("oneOf", ()))
                    if isinstance(b, Mapping) and b.get("type") != "null"]
        if len(branches) > 1:
            return None  # a union: any branch may hold it
        token = tokens[depth]
        here = pointer_text(tokens[:depth])
        kind = current.get("type")
        if kind == "array" or "items" in current or "prefixItems" in current:
            if not is_index(token):
                return f"{here} is a list, and {token!r} is not an index"
            prefix = current.get("prefixItems")
            index = list_index(token, len(prefix)) if isinstance(prefix, list) else None
            if index is not None:
                current = prefix[index]
            else:
                current = current.get("items", {})
            continue
        if kind == "object" or "properties" in current:
            properties = current.get("properties")
            extra = current.get("additionalProperties")
            if isinstance(properties, Mapping) and token in properties:
                current = properties[token]
                continue
            if isinstance(extra, Mapping):
                current = extra
                continue
            if extra is True or (properties is None and extra is not False):
                return None  # a free-form object: anything may be in it
            known = ", ".join(properties or ()) or "none"
            return f"{here} has no field {token!r} (its fields: {known})"
        if kind in _SCALAR_TYPES:
            return f"{here} is {'an' if kind == 'integer' else 'a'} {kind}, with nothing inside"
        return None  # untyped: unknown
    return None


def check_computed(label: str, model: type[BaseModel] | None,
                   computed: list[ComputedSource], planned: Sequence[Producer],
                   input_model: type[BaseModel] | None) -> list[Finding]:
    """The plan's checks of one step's constants and pointers (see compile_plan)."""
    problems: list[Finding] = []
    for item in computed:
        source = item.source
        what = f"{label} maps field {item.field!r} to {describe(source)}"
        if isinstance(source, Const):
            problem = None if model is None else constant_problem(model, item.field, source)
            if problem:
                problems.append(("ConstantTypeError", f"{what}, which does not fit "
                                 f"the field: {problem}", item.field))
            continue
        root = source.root
        producers: list[tuple[str, type[BaseModel] | None, str]] = []
        for position in item.candidates:
            earlier = planned[position]
            output = dict((key, name) for key, name in earlier.output_mapping).get(root, root)
            producers.append((f"step {earlier.id!r}", earlier.output_model, output))
            if earlier.fallback is not None:
                producers.append((f"step {earlier.id!r} fallback {earlier.fallback.name!r}",
                                  earlier.fallback.output_schema, output))
        if input_model is not None and root in input_model.model_fields:
            producers.append(("the flow input", input_model, root))
        elif not item.candidates:
            if input_model is not None:
                problems.append((
                    "MissingContextKeyError", f"{what}, but neither the flow input nor an "
                    f"earlier step provides context key {root!r}", item.field))
            continue
        for who, producer, name in producers:
            if producer is None or name not in producer.model_fields:
                continue  # an undeclared output may hold anything
            problem = pointer_problem(producer, name, source)
            if problem:
                problems.append(("UnknownFieldError", f"{what}, but in {who} {problem}",
                                 item.field))
                break
    return problems


# ------------------------------------------------------ clean without a plan
#
# Showing that :func:`~chainweaver.plan.compile_plan` would find no problem in a flow,
# without compiling it.
#
# Deciding whether a server publishes a flow needs to know whether the flow has
# problems, not its plan: the plan is needed only when the flow runs. Compiling every
# plan made the first list of a large catalogue slow (about 0.1 ms per flow), so the
# exposure decision asks :func:`clean_input_model` first and compiles only when it
# cannot answer.
#
# It answers for the common shape: tool steps whose tools, fallbacks and models are all
# declared, mapped from plain context keys. For anything else (a sub-flow step, a
# constant or pointer, an undeclared model, a missing tool) it answers None, "compile to
# know", and so it does wherever a check of ``compile_plan`` would report a problem:
# it only ever proves a flow clean, never finds it faulty, so every problem and its
# words still come from ``compile_plan`` alone. Each check below mirrors one there; a
# property test over random flows holds the two together.

# model -> (its field names, its required field names); models are few and live long.
_FIELDS: dict[type[BaseModel], tuple[frozenset[str], frozenset[str]]] = {}
_MAX_MODELS = 4096
# A step's tool, its tool's required input fields, and the context keys the step writes.
_Facts = tuple[Tool, frozenset[str], frozenset[str]]
# tool -> (its input fields, its required ones, its output fields), for tools that
# declare their output (tools are immutable)
_TOOLS: dict[Tool, tuple[frozenset[str], frozenset[str], frozenset[str]]] = {}
# steps -> the dependencies of a linear flow of that many steps (each after the one before)
_CHAINS: dict[int, tuple[tuple[int, ...], ...]] = {}


def _fields(model: type[BaseModel]) -> tuple[frozenset[str], frozenset[str]]:
    known = _FIELDS.get(model)
    if known is None:
        if len(_FIELDS) >= _MAX_MODELS:
            _FIELDS.clear()
        fields = model.model_fields
        known = _FIELDS[model] = (frozenset(fields), frozenset(
            name for name, info in fields.items() if info.is_required()))
    return known


def _tool_facts(tool: Tool) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """A tool's input fields, its required ones, and its output fields."""
    if len(_TOOLS) >= _MAX_MODELS:
        _TOOLS.clear()
    assert tool.output_schema is not None
    known = _TOOLS[tool] = (*_fields(tool.input_schema), _fields(tool.output_schema)[0])
    return known


def _chain(length: int) -> tuple[tuple[int, ...], ...]:
    chain = _CHAINS.get(length)
    if chain is None:
        chain = _CHAINS[length] = ((),) + tuple((index,) for index in range(length - 1))
    return chain


def clean_input_model(flow: Flow, tools: Mapping[str, Tool]) -> type[BaseModel] | None:
    """The input model of ``flow``'s plan when ``compile_plan`` over ``tools`` would
    report no problem at all; None when that is not shown here (then compile to know).
    """
    steps = flow.steps
    if flow.requires is not None or flow.delegations:
        return None  # step grants: the plan says what a caller must hold
    facts: list[_Facts] = []  # per declaration index
    for step in steps:
        tool = tools.get(step.tool_name) if step.flow is None else None  # type: ignore[arg-type]
        if tool is None:
            return None  # a sub-flow or a missing tool
        fallback = tools.get(step.fallback) if step.fallback is not None else None
        if step.requires is not None or tool.requires is not None \
                or (fallback is not None and fallback.requires is not None):
            return None  # step grants: the plan says what a caller must hold
        known = _TOOLS.get(tool)
        if known is None:
            if tool.output_schema is None:
                return None  # an undeclared output
            known = _tool_facts(tool)
        fields, required, produced = known
        writes = produced
        if step.fallback is not None or step.retry is not None or step.output_mapping:
            special = _writes(step, tool, tools, produced)
            if special is None:
                return None
            writes = special
        for name, source in step.input_mapping.items():
            if not isinstance(source, str) or name not in fields:
                return None  # a constant or pointer, or UnknownFieldError
        facts.append((tool, required, writes))
    input_model = flow.input_schema if flow.input_schema is not None \
        else derived_input_model(flow, facts[flow.order[0]][0].input_schema)
    input_keys = _fields(input_model)[0]
    for step, (tool, _, _) in zip(steps, facts, strict=True):
        if not _input_fits(input_model, input_keys, step, tool.input_schema):
            return None  # InputTypeError, or a field an earlier step writes first
    if flow.dependencies == _chain(len(steps)):
        clean = _chain_clean(steps, facts, input_keys)
    else:
        clean = _dag_clean(flow, facts, input_keys)
    if not clean:
        return None
    if flow.output_schema is not None:
        written = input_keys.union(*(writes for _, _, writes in facts))
        if not _fields(flow.output_schema)[1] <= written:
            return None  # OutputValidationError
    else:
        sink = steps[-1] if clean == "chain" else steps[flow.sink]  # type: ignore[index]
        if sink.fallback is not None and tools[sink.fallback].output_schema \
                is not tools[sink.tool_name].output_schema:  # type: ignore[index]
            return None  # FallbackOutputError
    return input_model


def clean_needs_approval(flow: Flow, tools: Mapping[str, Tool]) -> bool:
    """Whether a run of a flow :func:`clean_input_model` showed clean asks for approval
    (what ``approval_request`` finds in its plan): the flow's own contract requires it
    (it covers every step), or a step's tool or fallback does."""
    own = flow.safety
    if own is not None and own.requires_approval:
        return True
    for step in flow.steps:
        for name in (step.tool_name, step.fallback):
            safety = tools[name].safety if name is not None else None
            if safety is not None and safety.requires_approval:
                return True
    return False


def _writes(step: FlowStep, tool: Tool, tools: Mapping[str, Tool],
            produced: frozenset[str]) -> frozenset[str] | None:
    """What a step with a fallback, a retry or an output mapping writes (None: not
    shown clean)."""
    if step.fallback is not None:
        fallback = tools.get(step.fallback)
        if fallback is None or fallback.output_schema is None:
            return None
        produced = produced | _fields(fallback.output_schema)[0]
    if step.retry is not None and (tool.safety is None or not tool.safety.idempotent):
        return None  # RetryNotAllowedError
    if step.output_mapping:
        if any(name not in produced for name in step.output_mapping.values()):
            return None  # UnknownFieldError
        produced = frozenset(step.output_mapping)
    return produced


def _fed(step: FlowStep, required: frozenset[str], available: set[str] | frozenset[str]
         ) -> bool:
    """Whether every mapped key and unmapped required field of a step, and every name
    its condition reads, is available."""
    if step.condition is not None and not all(name in available
                                              for name in step.condition.names):
        return False
    mapping = step.input_mapping
    if not mapping:
        return required <= available
    return all(key in available for key in mapping.values()) and all(
        name in mapping or name in available for name in required)


def _input_fits(input_model: type[BaseModel], input_keys: frozenset[str], step: FlowStep,
                model: type[BaseModel]) -> bool:
    """Whether every field of ``model`` that a key of the flow input may feed takes
    every type the input accepts there (remembered per model pair and mapping)."""
    known = (input_model, model, tuple(step.input_mapping.items()))
    fits = _FITS.get(known)
    if fits is None:
        if len(_FITS) >= _MAX_MODELS:
            _FITS.clear()
        fits = _FITS[known] = all(
            input_type_problem(input_model, key, model, name) is None
            for name in model.model_fields
            for key in [step.input_mapping.get(name, name)]
            if isinstance(key, str) and key in input_keys)
    return fits


_FITS: dict[tuple[Any, ...], bool] = {}


def _chain_clean(steps: Sequence[FlowStep], facts: list[_Facts], input_keys: frozenset[str]
                 ) -> str | None:
    """Each step after the one before: what it reads is the input or written before."""
    available = set(input_keys)
    for step, (_, required, writes) in zip(steps, facts, strict=True):
        if not _fed(step, required, available):
            return None  # MissingContextKeyError
        available |= writes
    return "chain"


def _dag_clean(flow: Flow, facts: list[_Facts], input_keys: frozenset[str]) -> str | None:
    """Any DAG: what a step reads is the input or written by a step it runs after, and
    steps that may run at once write no key in common."""
    position_of = {index: position for position, index in enumerate(flow.order)}
    writes: list[frozenset[str]] = []
    ancestors: list[int] = []
    for position, index in enumerate(flow.order):
        _, required, written = facts[index]
        lineage = 0
        for dep in flow.dependencies[index]:
            lineage |= ancestors[position_of[dep]] | (1 << position_of[dep])
        available = input_keys.union(*(writes[p] for p in range(position)
                                       if lineage >> p & 1))
        if not _fed(flow.steps[index], required, available):
            return None  # MissingContextKeyError
        if any(not lineage >> p & 1 and writes[p] & written for p in range(position)):
            return None  # ConflictingWritesError
        writes.append(written)
        ancestors.append(lineage)
    return "dag"
