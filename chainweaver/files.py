"""Flows written as files: ``*.flow.yaml``, ``*.flow.yml`` or ``*.flow.json``, one flow each.

This module finds, reads and loads the files; :mod:`chainweaver.flow_data` turns their
content into flows. Every problem raises :class:`FlowFileError` naming the file, the field
(``steps[1].tool``) and what is wrong. Unknown and duplicate keys are errors, never ignored.
Files are held to :class:`FlowFileLimits` (size, nesting, string and number lengths; no
YAML anchors or aliases) while they are read, before any value is built.
A missing path raises :class:`FileNotFoundError`; YAML without PyYAML raises
:class:`ModuleNotFoundError` saying how to install it. See docs/flow-files.md for the format.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import FlowFileError, install_hint
from .flow_data import flow_from_data as flow_from_data  # re-exported: docs and tests
from .flow_data import import_model as import_model  # import both from here
from .flow_format import DEFAULT_LIMITS as DEFAULT_LIMITS
from .flow_format import FlowFileLimits as FlowFileLimits
from .flows import Flow
from .tools import Tool

FLOW_SUFFIXES = (".flow.yaml", ".flow.yml", ".flow.json")
YAML_INSTALL_HINT = install_hint("yaml")

PathLike = str | os.PathLike


# ------------------------------------------------------------------ finding files


def find_flow_files(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """Files as given, and directories' ``*.flow.{yaml,yml,json}`` (recursive, sorted);
    a file reached twice counts once."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*")
                           if p.is_file() and p.name.endswith(FLOW_SUFFIXES))
            if not files:
                raise FileNotFoundError(f"{path}: no *.flow.yaml, *.flow.yml or *.flow.json "
                                        "files in this directory")
        elif path.is_file():
            files = [path]
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
        for file in files:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                found.append(file)
    return found


# ------------------------------------------------------------------ reading files


def _at(mark: Any) -> str:
    return f"at line {mark.line + 1}, column {mark.column + 1}"


def _yaml_loader(path: Path, limits: FlowFileLimits) -> Any:
    """A safe YAML loader that rejects duplicate keys (PyYAML keeps the last silently),
    anchors and aliases, and anything over ``limits``, before building any value."""
    try:
        import yaml
    except ImportError:
        raise ModuleNotFoundError(
            f"YAML flow files need PyYAML: {YAML_INSTALL_HINT} (JSON flow files work "
            "without it)", name="yaml") from None

    class UniqueKeyLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            # The composer sees every node before the constructor builds a value, and
            # before its recursion can go deep: the place to refuse aliases and depth.
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise FlowFileError(path, None, f"not allowed {_at(event.start_mark)}: YAML "
                                    "anchors and aliases (&name, *name, << merge keys); "
                                    "write the value out")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if self.depth >= limits.max_depth:
                    raise FlowFileError(path, None, f"over a limit {_at(event.start_mark)}: "
                                        f"nested more than {limits.max_depth} levels deep "
                                        "(limit max_depth)")
                self.depth += 1
                try:
                    return super().compose_node(parent, index)
                finally:
                    self.depth -= 1
            return super().compose_node(parent, index)

        def compose_scalar_node(self, anchor: Any) -> Any:
            node = super().compose_scalar_node(anchor)
            _check_scalar_text(node.value, node.tag.rsplit(":", 1)[-1], limits,
                               lambda problem: FlowFileError(
                                   path, None, f"over a limit {_at(node.start_mark)}: "
                                   f"{problem}"))
            return node

    return yaml, _with_json_values(yaml, UniqueKeyLoader)


def _with_json_values(yaml: Any, loader: Any) -> Any:
    """``loader`` refusing duplicate keys and reading YAML as JSON values (no dates)."""

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        loader.flatten_mapping(node)  # resolve "<<" merge keys before checking duplicates
        keys: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in keys:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
                keys.add(key)
        return loader.construct_mapping(node, deep)

    loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                           construct_mapping)
    # Flow files describe JSON: an unquoted 2024-05-01 stays the text it is in JSON,
    # not a Python date that no JSON Schema or MCP message can carry.
    loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return loader


def _load_with_libyaml(yaml: Any, text: str, path: Path, limits: FlowFileLimits) -> Any:
    """The content of ``text`` read by libyaml (several times faster than PyYAML's pure
    Python reader: a 1 MiB file takes a second, not ten), or ``_SLOW`` when libyaml is
    not installed or the text has a YAML error, which the pure Python reader then
    reports in its words. The limits are checked on libyaml's events first, before any
    node or value is built, exactly as the pure Python composer checks them."""
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is None:
        return _SLOW
    loader = _with_json_values(yaml, type("JsonValueCLoader", (fast,), {}))
    resolver = loader("")  # resolves plain scalars as the loader will (no dates)
    depth = 0
    try:
        for event in yaml.parse(text, Loader=fast):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise FlowFileError(path, None, f"not allowed {_at(event.start_mark)}: YAML "
                                    "anchors and aliases (&name, *name, << merge keys); "
                                    "write the value out")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if depth >= limits.max_depth:
                    raise FlowFileError(path, None, f"over a limit {_at(event.start_mark)}: "
                                        f"nested more than {limits.max_depth} levels deep "
                                        "(limit max_depth)")
                depth += 1
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, yaml.ScalarEvent):
                tag = event.tag
                if tag is None or tag == "!":
                    tag = resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
                _check_scalar_text(event.value, tag.rsplit(":", 1)[-1], limits,
                                   _over_limit(path, event.start_mark))
        return yaml.load(text, Loader=loader)  # noqa: S506 - a CSafeLoader subclass
    except yaml.YAMLError:
        return _SLOW
    finally:
        resolver.dispose()


_SLOW = object()  # "read it with the pure Python reader"


def _over_limit(path: Path, mark: Any) -> Callable[[str], Exception]:
    return lambda problem: FlowFileError(path, None, f"over a limit {_at(mark)}: {problem}")


def _check_scalar_text(text: str, kind: str, limits: FlowFileLimits,
                       fail: Callable[[str], Exception]) -> None:
    """Check one scalar as written: ``kind`` is ``str``, ``int``, ``float`` or other."""
    if kind in ("int", "float"):
        if len(text) > limits.max_number_length:
            raise fail(f"a number of {len(text)} characters is longer than "
                       f"{limits.max_number_length} (limit max_number_length)")
        if kind == "float" and text.lower().lstrip("+-") not in (".inf", ".nan"):
            try:
                finite = math.isfinite(float(text.replace("_", "")))
            except ValueError:  # 1:30.5 (base 60): small whatever it says
                finite = True
            if not finite:
                raise fail(f"the number {text} is too large (not a finite number)")
    elif len(text) > limits.max_string_length:
        raise fail(f"a string of {len(text)} characters is longer than "
                   f"{limits.max_string_length} (limit max_string_length)")


_JSON_NUMBER = re.compile(r"-?[0-9][0-9.eE+-]*|-")
_JSON_TOKEN = re.compile(r'["\[\]{}0-9-]')
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)


def _check_json_text(path: Path, text: str, limits: FlowFileLimits) -> None:
    """Check JSON text against ``limits`` before parsing it: the json module recurses
    once per level (RecursionError) and refuses long integers (ValueError) on its own."""
    def fail(position: int, problem: str) -> FlowFileError:
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        return FlowFileError(path, None, f"over a limit at line {line}, column {column}: "
                             f"{problem}")

    depth = 0
    position = 0
    while True:
        found = _JSON_TOKEN.search(text, position)  # skip what cannot be over a limit
        if found is None:
            break
        position = found.start()
        char = text[position]
        if char == '"':
            match = _JSON_STRING.match(text, position)
            assert match is not None  # noqa: S101 - the pattern matches any '"'
            raw = match.group()
            if len(raw) - 2 > limits.max_string_length:
                try:
                    size = len(json.loads(raw))
                except ValueError:  # unterminated or a bad escape: json.loads says so
                    size = len(raw) - 1
                if size > limits.max_string_length:
                    raise fail(position, f"a string of {size} characters is longer than "
                               f"{limits.max_string_length} (limit max_string_length)")
            position = match.end()
            continue
        if char in "[{":
            depth += 1
            if depth > limits.max_depth:
                raise fail(position, f"nested more than {limits.max_depth} levels deep "
                           "(limit max_depth)")
        elif char in "]}":
            depth -= 1
        elif char == "-" or char.isdigit():
            match = _JSON_NUMBER.match(text, position)
            assert match is not None  # noqa: S101 - the pattern matches "-" and digits
            number = match.group()
            if len(number) > limits.max_number_length:
                raise fail(position, f"a number of {len(number)} characters is longer "
                           f"than {limits.max_number_length} (limit max_number_length)")
            if any(c in number for c in ".eE"):
                try:
                    finite = math.isfinite(float(number))
                except ValueError:
                    finite = True  # not a number at all: json.loads says where
                if not finite:
                    raise fail(position, f"the number {number} is too large (not a finite "
                               "number)")
            position = match.end()
            continue
        position += 1


def _read_text(path: Path, limits: FlowFileLimits) -> str:
    try:
        with path.open("rb") as file:
            content = file.read(limits.max_bytes + 1)  # never more, whatever the file is
    except OSError as error:
        raise FlowFileError(path, None, f"cannot be read: {error.strerror}") from None
    if len(content) > limits.max_bytes:
        raise FlowFileError(path, None, f"is larger than {limits.max_bytes} bytes "
                            "(limit max_bytes)")
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FlowFileError(path, None, f"is not UTF-8 text ({error.reason})") from None


def read_flow_data(path: Path, limits: FlowFileLimits = DEFAULT_LIMITS) -> Any:
    """The parsed content of one file (YAML by ``.yaml``/``.yml``, else JSON).

    The file is checked against ``limits`` while it is read, before any value is built;
    YAML anchors and aliases are refused.
    """
    path = Path(path)
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise FlowFileError(path, None, "unsupported file type: use .yaml, .yml or .json")
    text = _read_text(path, limits)
    if path.suffix in (".yaml", ".yml"):
        yaml, loader = _yaml_loader(path, limits)
        try:
            data = _load_with_libyaml(yaml, text, path, limits)
            if data is not _SLOW:
                return data
            return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
        except FlowFileError:
            raise
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" {_at(mark)}" if mark else ""
            problem = getattr(error, "problem", None) or str(error)
            raise FlowFileError(path, None, f"invalid YAML{where}: {problem}") from None
        except (RecursionError, ValueError, OverflowError) as error:  # limits should
            # keep these out; still a file error, never a traceback
            raise FlowFileError(path, None, f"invalid YAML: {type(error).__name__}: "
                                f"{str(error)[:200]}") from None

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for key, value in pairs:
            if key in data:
                raise FlowFileError(path, None, f"invalid JSON: duplicate key {key!r}")
            data[key] = value
        return data

    def not_json(name: str) -> Any:
        raise FlowFileError(path, None, f"invalid JSON: {name} is not a JSON value")

    _check_json_text(path, text, limits)
    try:
        return json.loads(text, object_pairs_hook=unique, parse_constant=not_json)
    except FlowFileError:
        raise
    except json.JSONDecodeError as error:
        raise FlowFileError(path, None, f"invalid JSON at line {error.lineno}, column "
                            f"{error.colno}: {error.msg}") from None
    except (RecursionError, ValueError) as error:  # limits should keep these out
        raise FlowFileError(path, None, f"invalid JSON: {type(error).__name__}: "
                            f"{str(error)[:200]}") from None


# ------------------------------------------------------------------ loading flows


def load_flow_file(path: PathLike, *, limits: FlowFileLimits = DEFAULT_LIMITS) -> Flow:
    """Read and build the one flow in ``path`` (checked against ``limits``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return flow_from_data(read_flow_data(path, limits), path, limits=limits)


def _check_tools(path: Path, flow: Flow, tools: Mapping[str, Tool]) -> None:
    def missing(name: str, field: str) -> FlowFileError:
        close = difflib.get_close_matches(name, list(tools), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return FlowFileError(path, field, f"no tool named {name!r} is registered ({hint}"
                             f"registered: {', '.join(sorted(tools)) or 'none'})")

    for index, step in enumerate(flow.steps):
        if step.fallback is not None and step.fallback not in tools:
            raise missing(step.fallback, f"steps[{index}].fallback")
        if step.tool_name is None:
            continue  # a sub-flow: checked when the executor plans the flow
        tool = tools.get(step.tool_name)
        if tool is None:
            raise missing(step.tool_name, f"steps[{index}].tool")
        for tool_field in step.input_mapping:
            if tool_field not in tool.input_fields:
                raise FlowFileError(path, f"steps[{index}].input_mapping.{tool_field}",
                                    f"tool {tool.name!r} has no input field {tool_field!r} "
                                    f"(its fields: {', '.join(tool.input_fields)})")


def load_flows(paths: PathLike | Iterable[PathLike], *,
               tools: Mapping[str, Tool] | None = None,
               limits: FlowFileLimits = DEFAULT_LIMITS) -> list[Flow]:
    """Every flow in ``paths`` (files, or directories searched recursively).

    With ``tools`` (name -> Tool, e.g. ``executor.tools``) each step's tool and input
    mapping is checked too. Two files defining the same flow name and version are an
    error. Every file is checked against ``limits`` (:class:`FlowFileLimits`) as it is
    read. Register the result with ``FlowRegistry.register_flow``.
    """
    return list(load_flows_by_file(paths, tools=tools, limits=limits).values())


def load_flows_by_file(paths: PathLike | Iterable[PathLike], *,
                       tools: Mapping[str, Tool] | None = None,
                       limits: FlowFileLimits = DEFAULT_LIMITS) -> dict[Path, Flow]:
    """Like :func:`load_flows`, keyed by the file each flow came from."""
    flows: dict[Path, Flow] = {}
    defined: dict[tuple[str, tuple], Path] = {}
    for path in find_flow_files(paths):
        flow = load_flow_file(path, limits=limits)
        key = (flow.name, flow.version_key)
        if key in defined:
            raise FlowFileError(path, "version", f"flow {flow.name!r} version "
                                f"{flow.version!r} is already defined in {defined[key]}")
        defined[key] = path
        if tools is not None:
            _check_tools(path, flow, tools)
        flows[path] = flow
    return flows
