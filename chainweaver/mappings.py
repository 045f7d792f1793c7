"""Input mappings: where each tool input field of a step reads its value.

A ``FlowStep.input_mapping`` maps a tool input field to one of

- a context key (a plain string, as ever): the value of that key;
- :class:`Pointer` (``"/customer/address/city"``): an RFC 6901 JSON pointer into the
  context, whose first token is a context key and the rest walk into its value (object
  keys, or list indices);
- :class:`Const` (``Const("metric")``): a literal JSON value.

In flow files the same three are ``field: key``, ``field: {pointer: /a/b}`` and
``field: {const: value}``. Both forms are checked when the step is defined; whether a
pointer fits the producing schema, and a constant the consuming field, is checked with
the tools (:mod:`chainweaver.mapping_checks`).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .errors import DefinitionError

MAX_POINTER_TOKENS = 32  # deeper is a mistake (and the static check walks each level)
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Const:
    """A literal JSON value for a tool input field (strings, numbers, booleans, null,
    lists and mappings of them). Each run gets its own copy."""

    value: Any

    def __post_init__(self) -> None:
        problem = _json_problem(self.value, "")
        if problem:
            raise DefinitionError(f"Const: {problem}")


@dataclass(frozen=True)
class Pointer:
    """An RFC 6901 JSON pointer into the context: ``"/customer/address/city"``.

    The first token names a context key (read like a mapped key: from the latest step
    this step runs after that writes it, else the flow input); the others walk into
    its value, by key in objects and by index in lists. ``~1`` stands for ``/`` and
    ``~0`` for ``~`` inside a token.
    """

    path: str

    def __post_init__(self) -> None:
        self.tokens  # noqa: B018 - parse now: a bad pointer fails where it is written

    @functools.cached_property
    def tokens(self) -> tuple[str, ...]:
        """The decoded tokens (not a field: serialised, a pointer is its path)."""
        return parse_pointer(self.path)

    @property
    def root(self) -> str:
        """The context key the pointer starts at."""
        return self.tokens[0]


MappingSource = str | Const | Pointer


def parse_pointer(path: object) -> tuple[str, ...]:
    """The decoded tokens of a JSON pointer; :class:`DefinitionError` says what is wrong."""
    if not isinstance(path, str):
        raise DefinitionError(f"a JSON pointer must be a string, got {type(path).__name__}")
    if not path.startswith("/"):
        raise DefinitionError(f"JSON pointer {path!r} must start with '/' (like "
                              "'/customer/address/city')")
    raw = path[1:].split("/")
    if len(raw) > MAX_POINTER_TOKENS:
        raise DefinitionError(f"JSON pointer {path[:80]!r} has more than "
                              f"{MAX_POINTER_TOKENS} tokens")
    tokens = []
    for token in raw:
        if "~" in token.replace("~0", "").replace("~1", ""):
            raise DefinitionError(f"JSON pointer {path!r}: '~' must be followed by 0 or 1 "
                                  "(~0 is '~', ~1 is '/')")
        tokens.append(token.replace("~1", "/").replace("~0", "~"))
    if not tokens[0]:
        raise DefinitionError(f"JSON pointer {path!r} must name a context key after '/'")
    return tuple(tokens)


def is_index(token: str) -> bool:
    """Whether a pointer token indexes a list: ASCII digits, no leading zero."""
    return token.isascii() and token.isdigit() and (token == "0" or token[0] != "0")


def list_index(token: str, length: int) -> int | None:
    """The item a pointer token indexes in a list of ``length`` items (None: none).

    A token with more digits than ``length`` has is past the end without reading it as
    a number: Python refuses to convert more than 4300 digits."""
    if not is_index(token) or len(token) > len(str(length)):
        return None
    index = int(token)
    return index if index < length else None


def pointer_text(tokens: tuple[str, ...] | list[str]) -> str:
    """A pointer's text from its decoded tokens."""
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _json_problem(value: Any, where: str, depth: int = 0) -> str | None:
    """Why ``value`` is not a JSON value (None: it is)."""
    place = f" at {where}" if where else ""
    if depth > 32:
        return f"nested too deeply{place}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r}{place} is not a JSON number"
    if isinstance(value, int) and value.bit_length() > 64 and not _writable(value):
        return (f"an integer{place} of more than {sys.get_int_max_str_digits()} digits is "
                "not a JSON number Python can write or read")
    if isinstance(value, _SCALARS):
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = _json_problem(item, f"{where}[{index}]", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"mapping keys must be strings{place}, got {key!r}"
            problem = _json_problem(item, f"{where}.{key}" if where else key, depth + 1)
            if problem:
                return problem
        return None
    return f"a {type(value).__name__}{place} is not a JSON value"


def _writable(number: int) -> bool:
    """Whether ``number`` can be written in decimal (Python refuses more than 4300
    digits by default, and json.dumps with it)."""
    try:
        str(number)
    except ValueError:
        return False
    return True


def input_mapping_of(label: str, value: object) -> Mapping[str, MappingSource]:
    """A step's ``input_mapping`` checked and frozen; DefinitionError names the field."""
    if not isinstance(value, Mapping):
        raise DefinitionError(f"{label}: input_mapping must be a mapping of strings, got "
                              f"{type(value).__name__}")
    mapping = dict(value)
    for name, source in mapping.items():
        if not isinstance(name, str):
            raise DefinitionError(f"{label}: input_mapping keys and values must be strings "
                                  f"(or Const / Pointer values), got key {name!r}")
        if not isinstance(source, (str, Const, Pointer)):
            raise DefinitionError(
                f"{label}: input_mapping values must be context keys (strings), "
                f"Const(value) or Pointer('/path'); field {name!r} has a "
                f"{type(source).__name__} (wrap a literal in Const)")
    return MappingProxyType(mapping)


def source_data(source: MappingSource) -> Any:
    """A mapping source as flow files write it."""
    if isinstance(source, Const):
        return {"const": copy.deepcopy(source.value)}
    if isinstance(source, Pointer):
        return {"pointer": source.path}
    return source


def describe(source: MappingSource) -> str:
    """A source in error messages' words."""
    if isinstance(source, Const):
        return f"constant {json.dumps(source.value)[:60]}"
    if isinstance(source, Pointer):
        return f"JSON pointer {source.path!r}"
    return f"context key {source!r}"


# ------------------------------------------------------------------ at run time


@dataclass(slots=True)
class ComputedSource:
    """A field fed by a constant or a pointer, as the plan holds it."""

    field: str
    source: Const | Pointer
    candidates: tuple[int, ...] = ()  # plan positions that may write the pointer's root


class MappingMiss(Exception):
    """A pointer found nothing at run time; the message says where it stopped."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def gather_computed(computed: tuple[ComputedSource, ...], writes: list[Any],
                    flow_input: Mapping[str, Any], arguments: dict[str, Any]) -> None:
    """Set each constant- or pointer-fed field in ``arguments``; MappingMiss if a
    pointer leads nowhere."""
    for item in computed:
        source = item.source
        if isinstance(source, Const):
            value = source.value
            arguments[item.field] = value if isinstance(value, _SCALARS) \
                else copy.deepcopy(value)  # a tool may change what it is given
            continue
        root = source.tokens[0]
        for position in item.candidates:
            written = writes[position]
            if written is not None and root in written:
                value = written[root]
                break
        else:
            if root not in flow_input:
                raise MappingMiss(item.field, f"field {item.field!r} reads JSON pointer "
                                  f"{source.path!r}, but context key {root!r} does not exist")
            value = flow_input[root]
        arguments[item.field] = walk(item.field, source, value)


def walk(field_name: str, source: Pointer, value: Any) -> Any:
    """The value ``source``'s tokens after the first lead to inside ``value``."""
    tokens = source.tokens
    for depth in range(1, len(tokens)):
        token = tokens[depth]
        if isinstance(value, Mapping):
            if token in value:
                value = value[token]
                continue
            problem = f"has no key {token!r}"
        elif isinstance(value, (list, tuple)):
            index = list_index(token, len(value))
            if index is not None:
                value = value[index]
                continue
            problem = f"is a list of {len(value)} items, with no index {token!r}"
        else:
            problem = f"is {_kind(value)}, not an object or a list"
        raise MappingMiss(field_name, f"field {field_name!r} reads JSON pointer "
                          f"{source.path!r}, but {pointer_text(tokens[:depth])} {problem}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", int: "a number",
            float: "a number"}.get(type(value), f"a {type(value).__name__}")
