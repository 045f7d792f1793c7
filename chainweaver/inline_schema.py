"""Pydantic models built from inline JSON Schema (used by flow files).

The executor validates with pydantic models and ``FlowServer`` publishes their JSON
Schema, so an inline schema becomes a model that

- validates exactly what the schema allows, for the supported keywords (anything
  else is rejected with its location, never silently ignored);
- publishes the author's schema unchanged (``model_json_schema()`` returns it);
- leaves an optional property without a default absent, instead of inventing a
  ``None`` that would then flow into the next step's input.

Supported: ``type`` (one type, or ``[type, "null"]``), ``enum``, ``const``; strings:
``minLength``, ``maxLength``, ``pattern``; integers and numbers: ``minimum``,
``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``multipleOf``; arrays:
``items``, ``minItems``, ``maxItems``; objects: ``properties``, ``required``,
``additionalProperties`` (true or false); and the annotations in ``ANNOTATIONS``.
For anything more, reference a pydantic model instead.
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Union

import annotated_types as at
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    create_model,
    model_serializer,
)

from .errors import DefinitionError

# Keywords that describe a value without constraining it ("format" is an annotation
# in JSON Schema 2020-12 unless a validator opts in to asserting it).
ANNOTATIONS = frozenset({"title", "description", "examples", "default", "deprecated",
                         "readOnly", "writeOnly", "$comment", "format"})
_NUMERIC = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                      "multipleOf"})
TYPE_KEYWORDS: Mapping[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength", "pattern"}),
    "integer": _NUMERIC,
    "number": _NUMERIC,
    "boolean": frozenset(),
    "null": frozenset(),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
}
_TOP_LEVEL_EXTRA = frozenset({"$schema", "$id"})
# Annotations are published as written, so a wrong type would break clients' schema
# parsing (and prompt rendering) for the flow: check what each must be.
ANNOTATION_TYPES: Mapping[str, tuple[type | tuple[type, ...], str]] = {
    **{key: (str, "a string") for key in ("title", "description", "$comment", "format",
                                          "$id", "$schema")},
    "examples": (list, "a list of example values"),
    **{key: (bool, "true or false") for key in ("deprecated", "readOnly", "writeOnly")},
}
DIALECTS = re.compile(r"json-schema\.org/(draft/2020-12|draft/2019-09|draft-07|draft-06)/")
PROPERTY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # whole string: use fullmatch


class InlineSchemaError(DefinitionError):
    """An inline JSON Schema uses something unsupported or invalid, at ``where``."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}" if where else problem)


class InlineModel(BaseModel):
    """Base of every model built here. Extra properties are ignored (allowed, as in
    JSON Schema, but never carried into a flow's context)."""

    model_config = ConfigDict(extra="ignore")
    _json_schema: ClassVar[dict[str, Any]] = {}
    _absent: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        return copy.deepcopy(cls._json_schema)

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        data = handler(self)
        for name in type(self)._absent:
            if name not in self.model_fields_set:
                data.pop(name, None)
        return data


class ClosedInlineModel(InlineModel):
    """For ``additionalProperties: false``."""

    model_config = ConfigDict(extra="forbid")


def model_from_json_schema(schema: object, name: str) -> type[BaseModel]:
    """A pydantic model named ``name`` that validates and publishes ``schema``.

    ``schema`` must be an object schema (``"type": "object"``). Raises
    :class:`InlineSchemaError` naming the keyword path of the first problem.
    """
    if not isinstance(schema, Mapping):
        raise InlineSchemaError("", "must be a JSON Schema object")
    if schema.get("type") != "object":
        raise InlineSchemaError("type", "must be 'object': a flow's input and output "
                                "are JSON objects")
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as error:
        # A YAML date, NaN or Infinity would be published as invalid JSON Schema.
        raise InlineSchemaError("", f"must hold JSON values only: {error}") from None
    _check_keywords(schema, "", TYPE_KEYWORDS["object"] | _TOP_LEVEL_EXTRA)
    dialect = schema.get("$schema")
    if dialect is not None and not (isinstance(dialect, str) and DIALECTS.search(dialect)):
        raise InlineSchemaError("$schema", "must name JSON Schema 2020-12, 2019-09, draft-07 "
                                f"or draft-06, got {dialect!r}")
    return _object_model(schema, name, "")


# ------------------------------------------------------------------ helpers


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_keywords(schema: Mapping[str, Any], where: str, allowed: frozenset[str]) -> None:
    allowed = allowed | ANNOTATIONS | {"type", "enum", "const"}
    if schema.get("type") in ("object", "array") and ("enum" in schema or "const" in schema):
        raise InlineSchemaError(_join(where, "enum" if "enum" in schema else "const"),
                                "enum and const are supported on scalar values only in an "
                                "inline schema (reference a pydantic model for more)")
    for key in schema:
        if not isinstance(key, str):
            raise InlineSchemaError(where, f"keys must be strings, got {key!r}")
        wanted = ANNOTATION_TYPES.get(key)
        if wanted is not None and not isinstance(schema[key], wanted[0]):
            raise InlineSchemaError(_join(where, key),
                                    f"must be {wanted[1]}, got {schema[key]!r}")
        if key not in allowed:
            kind = schema.get("type")
            what = f"for type {kind!r}" if isinstance(kind, str) else "here"
            raise InlineSchemaError(
                _join(where, key),
                f"keyword {key!r} is not supported {what} in an inline schema "
                "(reference a pydantic model for more)",
            )


def _number(schema: Mapping[str, Any], where: str, key: str, *, integer: bool = False) -> Any:
    value = schema[key]
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (integer and value < 0):
        wanted = "a non-negative integer" if integer else "a number"
        raise InlineSchemaError(_join(where, key), f"must be {wanted}, got {value!r}")
    return value


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON Schema defines it: true is not 1, but 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _one_of(values: list[Any]) -> Callable[[Any], Any]:
    shown = ", ".join(repr(v) for v in values)

    def check(value: Any) -> Any:
        if any(_json_equal(value, allowed) for allowed in values):
            return value
        raise ValueError(f"must be one of {shown}")

    return check


def _integral(value: Any) -> Any:
    # JSON Schema counts 3.0 as an integer; strict pydantic would not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_BOUNDS: Mapping[str, tuple[Callable[[Any, Any], bool], str]] = {
    "minimum": (lambda v, b: v >= b, "greater than or equal to"),
    "maximum": (lambda v, b: v <= b, "less than or equal to"),
    "exclusiveMinimum": (lambda v, b: v > b, "greater than"),
    "exclusiveMaximum": (lambda v, b: v < b, "less than"),
}


def _multiple(value: Any, step: Any) -> bool:
    # The same arithmetic as the jsonschema library: a quotient for a float step, a
    # remainder for an integer step (exact even for a huge float value).
    if isinstance(step, float):
        try:
            return float(value / step).is_integer()
        except OverflowError:
            return False
    return value % step == 0


def _numeric_check(schema: Mapping[str, Any], where: str) -> list[Any]:
    """One validator for the numeric keywords: bounds may be floats for integers too."""
    limits = {key: _number(schema, where, key) for key in _NUMERIC if key in schema}
    if not limits:
        return []
    if limits.get("multipleOf", 1) <= 0:
        raise InlineSchemaError(_join(where, "multipleOf"), "must be greater than 0")

    def check(value: Any) -> Any:
        for key, (holds, words) in _BOUNDS.items():
            if key in limits and not holds(value, limits[key]):
                raise ValueError(f"must be {words} {limits[key]}")
        if "multipleOf" in limits and not _multiple(value, limits["multipleOf"]):
            raise ValueError(f"must be a multiple of {limits['multipleOf']}")
        return value

    return [AfterValidator(check)]


def _annotated(base: Any, extras: list[Any]) -> Any:
    if not extras:
        return base
    arguments = (base, *extras)  # Annotated[base, extra, ...] built at run time
    return Annotated[arguments]


def _typed(kind: str, schema: Mapping[str, Any], where: str, name: str) -> Any:
    """The pydantic type for one JSON type, with its constraints."""
    if kind == "string":
        lengths = {"min_length": "minLength", "max_length": "maxLength"}
        options = {arg: _number(schema, where, key, integer=True)
                   for arg, key in lengths.items() if key in schema}
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                raise InlineSchemaError(_join(where, "pattern"), "must be a string")
            options["pattern"] = schema["pattern"]
        annotation = _annotated(StrictStr, [StringConstraints(**options)] if options else [])
        if "pattern" in options:  # the regex engine rejects look-arounds: say where
            _check_adapter(annotation, _join(where, "pattern"))
        return annotation
    if kind == "integer":
        return _annotated(StrictInt, [BeforeValidator(_integral),
                                      *_numeric_check(schema, where)])
    if kind == "number":
        return _annotated(Union[StrictInt, StrictFloat], _numeric_check(schema, where))
    if kind == "boolean":
        return StrictBool
    if kind == "null":
        return None
    if kind == "array":
        items = schema.get("items")
        item_type = Any if items is None else _field_type(items, _join(where, "items"),
                                                         f"{name}Item")
        item_lengths: list[Any] = [
            cls(_number(schema, where, key, integer=True))
            for key, cls in (("minItems", at.MinLen), ("maxItems", at.MaxLen)) if key in schema]
        return _annotated(list[item_type], item_lengths)  # type: ignore[valid-type]
    # object
    additional = schema.get("additionalProperties", True)
    if not isinstance(additional, bool):
        raise InlineSchemaError(_join(where, "additionalProperties"),
                                "must be true or false in an inline schema")
    if "properties" in schema or not additional:
        return _object_model(schema, name, where)
    return dict[str, Any]


def _field_type(schema: object, where: str, name: str) -> Any:
    """The pydantic type of a property schema: its type, nullability, enum or const."""
    if not isinstance(schema, Mapping):
        raise InlineSchemaError(where, f"must be a JSON Schema object, got {schema!r}")
    kind = schema.get("type")
    nullable = False
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if len(kind) != 2 or len(others) != 1:
            raise InlineSchemaError(_join(where, "type"),
                                    "a list of types must be [type, 'null']")
        kind, nullable = others[0], True
    if kind is not None and (not isinstance(kind, str) or kind not in TYPE_KEYWORDS):
        raise InlineSchemaError(_join(where, "type"), f"unknown type {kind!r} (use one of "
                                f"{', '.join(TYPE_KEYWORDS)})")
    _check_keywords(schema, where, TYPE_KEYWORDS[kind] if kind else frozenset())
    result: Any = Any if kind is None else _typed(kind, schema, where, name)
    if nullable:
        result = Union[result, None]
    allowed = _allowed_values(schema, where)
    if allowed is not None:
        adapter = _check_adapter(result, where)
        for index, value in enumerate(allowed):
            try:
                adapter.validate_python(value)
            except ValidationError:
                key = "const" if "const" in schema else f"enum[{index}]"
                raise InlineSchemaError(_join(where, key),
                                        f"{value!r} does not fit type {kind!r}") from None
        result = Annotated[result, AfterValidator(_one_of(allowed))]
    _check_adapter(result, where)
    return result


def _allowed_values(schema: Mapping[str, Any], where: str) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    if "enum" not in schema:
        return None
    values = schema["enum"]
    if not isinstance(values, list) or not values:
        raise InlineSchemaError(_join(where, "enum"), "must be a non-empty list")
    return values


def _check_adapter(annotation: Any, where: str) -> TypeAdapter[Any]:
    try:
        return TypeAdapter(annotation)
    except Exception as error:  # e.g. a pattern the regex engine cannot compile
        detail = " ".join(str(error).split())
        raise InlineSchemaError(where, f"cannot be used: {detail}") from None


def _validation_summary(error: ValidationError) -> str:
    first = error.errors()[0]
    place = ".".join(str(p) for p in first.get("loc", ()))
    return f"{place}: {first['msg']}" if place else first["msg"]


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("must not be null")
    return value


def _may_be_absent(annotation: Any) -> Any:
    """The type of an optional property without a default: ``None`` stands for absent
    (and is dropped on output), so the type admits it, while a null *sent* by a caller
    is still refused unless the schema allows null."""
    try:
        TypeAdapter(annotation).validate_python(None)
        return annotation
    except ValidationError:
        return Annotated[Union[annotation, None], AfterValidator(_not_null)]


def _object_model(schema: Mapping[str, Any], name: str, where: str) -> type[BaseModel]:
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise InlineSchemaError(_join(where, "properties"), "must be an object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InlineSchemaError(_join(where, "required"), "must be a list of property names")
    for field_name in required:
        if field_name not in properties:
            raise InlineSchemaError(_join(where, "required"),
                                    f"names {field_name!r}, which is not in properties")
    fields: dict[str, Any] = {}
    absent = set()
    for prop, prop_schema in properties.items():
        here = _join(_join(where, "properties"), str(prop))
        if not isinstance(prop, str) or not PROPERTY_NAME.fullmatch(prop) or \
                prop.startswith("model_"):
            raise InlineSchemaError(here, "property names must be identifiers (letters, "
                                    "digits, '_'; not starting with 'model_')")
        camel = "".join(part.capitalize() for part in prop.split("_"))
        annotation = _field_type(prop_schema, here, f"{name}{camel}")
        if prop in required:
            fields[prop] = (annotation, ...)
        elif "default" in prop_schema:
            default = prop_schema["default"]
            try:
                TypeAdapter(annotation).validate_python(default)
            except ValidationError as error:
                raise InlineSchemaError(_join(here, "default"),
                                        f"does not fit the schema: "
                                        f"{_validation_summary(error)}") from None
            fields[prop] = (annotation, Field(copy.deepcopy(default), validate_default=True))
        else:
            fields[prop] = (_may_be_absent(annotation), None)
            absent.add(prop)
    base = ClosedInlineModel if schema.get("additionalProperties", True) is False \
        else InlineModel
    with warnings.catch_warnings():
        # Names like "schema" or "json" shadow deprecated BaseModel methods: harmless here.
        warnings.simplefilter("ignore", UserWarning)
        model = create_model(name, __base__=base, **fields)
    model._json_schema = copy.deepcopy(dict(schema))
    model._absent = frozenset(absent)
    return model
