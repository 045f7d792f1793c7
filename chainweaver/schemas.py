"""JSON Schemas of flows, and example values derived from a schema."""

from __future__ import annotations

import copy
from typing import Annotated, Any

from pydantic import BaseModel

_SCHEMA_CACHE: dict[type[BaseModel], dict[str, Any]] = {}


def model_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema, generated once per class (generation is slow).

    Returns the cached dict itself: callers must not mutate it.
    """
    schema = _SCHEMA_CACHE.get(model)
    if schema is None:
        schema = model.model_json_schema()
        _SCHEMA_CACHE[model] = schema
    return schema


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Follow a local ``$ref`` and unwrap single-branch ``allOf``/nullable ``anyOf``."""
    for _ in range(32):  # bounded: recursive schemas must not loop forever
        if "$ref" in schema and schema["$ref"].startswith("#/"):
            target: Any = root
            for part in schema["$ref"][2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            merged = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **merged}
            continue
        if "allOf" in schema and len(schema["allOf"]) == 1:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            schema = {**schema["allOf"][0], **merged}
            continue
        branches = schema.get("anyOf")
        if branches:
            non_null = [b for b in branches if b.get("type") != "null"]
            if non_null:
                merged = {k: v for k, v in schema.items() if k != "anyOf"}
                schema = {**non_null[0], **merged}
                continue
        break
    return schema


def resolve_property(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Public form of ``_resolve``: a property schema with refs and wrappers removed."""
    return _resolve(schema, root)


def example_value(schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """A value fitting ``schema``: its example, default, first enum value, or a placeholder."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    if "examples" in schema and schema["examples"]:
        return copy.deepcopy(schema["examples"][0])
    if "example" in schema:
        return copy.deepcopy(schema["example"])
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        return example_arguments(schema, root)
    if kind == "array":
        minimum = schema.get("minItems", 0)
        items = schema.get("items", {})
        return [example_value(items, root) for _ in range(minimum)]
    if kind == "integer":
        return _number(schema, 0, int)
    if kind == "number":
        return _number(schema, 0.0, float)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind == "string":
        length = schema.get("minLength", 1)
        return "x" * max(length, 1)
    return "example"


def _number(schema: dict[str, Any], fallback: Any, cast: type) -> Any:
    if "minimum" in schema:
        return cast(schema["minimum"])
    if "exclusiveMinimum" in schema:
        return cast(schema["exclusiveMinimum"] + 1)
    if "maximum" in schema:
        return cast(min(schema["maximum"], 0) if schema["maximum"] >= 0 else schema["maximum"])
    return fallback


def example_arguments(schema: dict[str, Any], root: dict[str, Any] | None = None) -> dict[str, Any]:
    """Example values for the *required* properties of an object schema."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    properties = schema.get("properties", {})
    return {
        name: example_value(properties[name], root)
        for name in schema.get("required", [])
        if name in properties
    }


def field_annotation(model: type[BaseModel], name: str) -> Any:
    """The field's type with its constraints (pydantic keeps them as metadata)."""
    info = model.model_fields[name]
    if info.metadata:
        parts = (info.annotation, *info.metadata)
        return Annotated[parts]
    return info.annotation
