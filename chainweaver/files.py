"""Flows written as files: ``*.flow.yaml``, ``*.flow.yml`` or ``*.flow.json``, one flow each.

This module finds, reads and loads the files; :mod:`chainweaver.flow_data` turns their
content into flows. Every problem raises :class:`FlowFileError` naming the file, the field
(``steps[1].tool``) and what is wrong. Unknown and duplicate keys are errors, never ignored.
A missing path raises :class:`FileNotFoundError`; YAML without PyYAML raises
:class:`ModuleNotFoundError` saying how to install it. See docs/flow-files.md for the format.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import FlowFileError
from .flow_data import flow_from_data as flow_from_data  # re-exported: docs and tests
from .flow_data import import_model as import_model  # import both from here
from .flows import Flow
from .tools import Tool

FLOW_SUFFIXES = (".flow.yaml", ".flow.yml", ".flow.json")
YAML_INSTALL_HINT = "pip install 'chainweaver[yaml]'"

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


def _yaml_loader() -> Any:
    """A safe YAML loader that rejects duplicate keys (PyYAML keeps the last silently)."""
    try:
        import yaml
    except ImportError:
        raise ModuleNotFoundError(
            f"YAML flow files need PyYAML: {YAML_INSTALL_HINT} (JSON flow files work "
            "without it)", name="yaml") from None

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

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

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                    construct_mapping)
    # Flow files describe JSON: an unquoted 2024-05-01 stays the text it is in JSON,
    # not a Python date that no JSON Schema or MCP message can carry.
    UniqueKeyLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return yaml, UniqueKeyLoader


def read_flow_data(path: Path) -> Any:
    """The parsed content of one file (YAML by ``.yaml``/``.yml``, else JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise FlowFileError(path, None, f"is not UTF-8 text ({error.reason})") from None
    except OSError as error:
        raise FlowFileError(path, None, f"cannot be read: {error.strerror}") from None
    if path.suffix in (".yaml", ".yml"):
        yaml, loader = _yaml_loader()
        try:
            return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(error, "problem", None) or str(error)
            raise FlowFileError(path, None, f"invalid YAML{where}: {problem}") from None
    if path.suffix != ".json":
        raise FlowFileError(path, None, "unsupported file type: use .yaml, .yml or .json")

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for key, value in pairs:
            if key in data:
                raise FlowFileError(path, None, f"invalid JSON: duplicate key {key!r}")
            data[key] = value
        return data

    def not_json(name: str) -> Any:
        raise FlowFileError(path, None, f"invalid JSON: {name} is not a JSON value")

    try:
        return json.loads(text, object_pairs_hook=unique, parse_constant=not_json)
    except json.JSONDecodeError as error:
        raise FlowFileError(path, None, f"invalid JSON at line {error.lineno}, column "
                            f"{error.colno}: {error.msg}") from None


# ------------------------------------------------------------------ loading flows


def load_flow_file(path: PathLike) -> Flow:
    """Read and build the one flow in ``path``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return flow_from_data(read_flow_data(path), path)


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
               tools: Mapping[str, Tool] | None = None) -> list[Flow]:
    """Every flow in ``paths`` (files, or directories searched recursively).

    With ``tools`` (name -> Tool, e.g. ``executor.tools``) each step's tool and input
    mapping is checked too. Two files defining the same flow name and version are an
    error. Register the result with ``FlowRegistry.register_flow``.
    """
    return list(load_flows_by_file(paths, tools=tools).values())


def load_flows_by_file(paths: PathLike | Iterable[PathLike], *,
                       tools: Mapping[str, Tool] | None = None) -> dict[Path, Flow]:
    """Like :func:`load_flows`, keyed by the file each flow came from."""
    flows: dict[Path, Flow] = {}
    defined: dict[tuple[str, tuple], Path] = {}
    for path in find_flow_files(paths):
        flow = load_flow_file(path)
        key = (flow.name, flow.version_key)
        if key in defined:
            raise FlowFileError(path, "version", f"flow {flow.name!r} version "
                                f"{flow.version!r} is already defined in {defined[key]}")
        defined[key] = path
        if tools is not None:
            _check_tools(path, flow, tools)
        flows[path] = flow
    return flows
