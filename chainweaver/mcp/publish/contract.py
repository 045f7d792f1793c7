"""A flow's published contract: what its tool, schema resource and prompt advertise.

Computed once per exposure decision (and once per model class, since many flows
share their tools' models) and carried on the exposed flow, so no primitive ever
re-derives a schema.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastmcp.utilities.json_schema import dereference_refs
from pydantic import BaseModel, TypeAdapter

from chainweaver.executor import FlowExecutor
from chainweaver.flows import Flow
from chainweaver.schemas import model_json_schema, resolve_property


@dataclass(frozen=True)
class ArgumentSpec:
    """One top-level input property, as a prompt argument."""

    name: str
    description: str
    required: bool
    # The property schema with refs and nullable wrappers removed (unions stay unions).
    schema: Mapping[str, Any]


@dataclass(frozen=True)
class PublishedContract:
    """The input and output a flow's tool advertises, and the model that checks input."""

    input_model: type[BaseModel]
    output_model: type[BaseModel] | None
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    arguments: tuple[ArgumentSpec, ...]
    # Schema defaults the input model accepts: prompts fill omitted arguments with them.
    defaults: Mapping[str, Any]

    @functools.cached_property  # read on every prompt render; the contract never changes
    def required_arguments(self) -> dict[str, bool]:
        """Argument name -> required, in schema order."""
        return {spec.name: spec.required for spec in self.arguments}


class ContractError(Exception):
    """The flow's JSON Schema cannot be published; the message says why."""


SchemaMode = Literal["validation", "serialization"]
# (model class, mode) -> its dereferenced schema, or the reason it cannot be published
_PUBLISHED: dict[tuple[type[BaseModel], SchemaMode], dict[str, Any] | str] = {}


def published_schema(model: type[BaseModel], mode: SchemaMode = "validation"
                     ) -> dict[str, Any] | str:
    """The JSON Schema a model is advertised with (refs inlined: some clients cannot
    follow ``$ref``), or why it cannot be published. Computed once per class.

    Inputs are described as they are validated; outputs as they are serialised, which
    is what a result's structured content holds (computed fields, custom serialisers).
    """
    cached = _PUBLISHED.get((model, mode))
    if cached is not None:
        return cached
    result: dict[str, Any] | str
    try:
        schema = (model_json_schema(model) if mode == "validation"
                  else model.model_json_schema(mode="serialization"))
    except Exception as error:  # pydantic raises several error types while generating
        detail = str(error).splitlines()[0]
        result = f"cannot be generated from {model.__name__}: {detail}"
    else:
        try:
            json.dumps(schema, allow_nan=False)  # e.g. a NaN default, a date example
            result = dereference_refs(schema)
        except (TypeError, ValueError) as error:
            result = f"from {model.__name__} is not valid JSON: {error}"
    _PUBLISHED[(model, mode)] = result
    return result


# (input model, output model) -> the contract they publish. A contract depends on
# nothing else, and catalogues combine a few tools into many flows, so sharing it
# keeps the exposure decision over 20,000 flows from deriving 20,000 argument lists.
_CONTRACTS: dict[tuple[type[BaseModel], type[BaseModel] | None], PublishedContract] = {}


def build_contract(executor: FlowExecutor, flow: Flow,
                   input_model: type[BaseModel] | None = None) -> PublishedContract:
    """The flow's contract; :class:`ContractError` when a schema cannot be published.

    ``input_model``: its plan's, when known without the plan. Flows with the same input
    and output models share one (immutable) contract.
    """
    # The plan's: a first step's constants and pointers change what the caller gives.
    if input_model is None:
        input_model = executor.plan(flow).input_model
    output_model = executor.output_model(flow)
    if input_model is None:
        raise ContractError("its input model is unknown")
    key = (input_model, output_model)
    contract = _CONTRACTS.get(key)
    if contract is None:
        contract = _CONTRACTS[key] = _contract(input_model, output_model)
    return contract


def _contract(input_model: type[BaseModel], output_model: type[BaseModel] | None
              ) -> PublishedContract:
    input_schema = published_schema(input_model)
    if isinstance(input_schema, str):
        raise ContractError(f"its input JSON Schema {input_schema}")
    output_schema = (None if output_model is None
                     else published_schema(output_model, "serialization"))
    if isinstance(output_schema, str):
        raise ContractError(f"its output JSON Schema {output_schema}")
    arguments = argument_specs(input_schema)
    defaults = {spec.name: spec.schema["default"] for spec in arguments
                if "default" in spec.schema
                and _accepts(input_model, spec.name, spec.schema["default"])}
    return PublishedContract(input_model, output_model, input_schema, output_schema,
                             arguments, defaults)


def _accepts(model: type[BaseModel], field: str, value: Any) -> bool:
    """Whether the model's field validates ``value`` (pydantic does not check defaults)."""
    info = model.model_fields.get(field)
    if info is None:
        return False
    annotation: Any = info.annotation
    if info.metadata:  # constraints such as ge=1 travel as Annotated metadata
        parts = (annotation, *info.metadata)
        annotation = Annotated[parts]
    try:
        TypeAdapter(annotation).validate_python(value)
    except Exception:  # a validation error, or a type pydantic cannot adapt alone
        return False
    return True


def _union_types(prop: Mapping[str, Any]) -> list[str]:
    """The non-null branch types of an ``anyOf``; a ``$ref`` branch is a model, an object."""
    return [str(b.get("type", "object" if "$ref" in b or "properties" in b else "value"))
            for b in prop.get("anyOf", ()) if isinstance(b, Mapping) and b.get("type") != "null"]


def property_schema(raw: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    """A property schema with refs and nullable wrappers removed.

    A union of several non-null types (``int | str``) stays a union: reading it as
    its first branch would reject values the schema accepts.
    """
    branches = raw.get("anyOf")
    if isinstance(branches, list) and len(_union_types(raw)) != 1:
        return dict(raw)
    return resolve_property(dict(raw), dict(root))


def property_kind(prop: Mapping[str, Any]) -> str | None:
    """The property's single JSON type, ``"enum"``, or None (a union or untyped)."""
    kind = prop.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    if kind is None and "enum" in prop:
        return "enum"
    return kind


def show_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def describe_property(prop: Mapping[str, Any]) -> str:
    """One line for a prompt argument: description, type, allowed values, default, examples."""
    parts = []
    if prop.get("description"):
        parts.append(str(prop["description"]).rstrip("."))
    kind = property_kind(prop)
    if kind and kind != "enum":
        parts.append(f"Type: {kind}" + (" (JSON text)" if kind in ("array", "object") else ""))
    elif kind is None and _union_types(prop):
        parts.append("Type: " + " or ".join(dict.fromkeys(_union_types(prop))))
    if prop.get("enum"):
        parts.append("Allowed values: " + ", ".join(show_value(v) for v in prop["enum"]))
    if "default" in prop:
        parts.append(f"Default: {show_value(prop['default'])}")
    if prop.get("examples"):
        parts.append("Examples: " + ", ".join(show_value(v) for v in prop["examples"][:3]))
    return ". ".join(parts) + "." if parts else ""


def argument_specs(schema: Mapping[str, Any]) -> tuple[ArgumentSpec, ...]:
    """One spec per top-level property of an input schema, in schema order."""
    required = set(schema.get("required", ()))
    specs = []
    for name, raw in schema.get("properties", {}).items():
        prop = property_schema(raw, schema)
        specs.append(ArgumentSpec(name, describe_property(prop),
                                  name in required and "default" not in prop, prop))
    return tuple(specs)
