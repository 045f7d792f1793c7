"""Where a field of a flow file is written: the line of ``steps[1].input_mapping.amount``.

Flow-file errors name a field (:class:`~chainweaver.FlowFileError`) and static checks a
step; ``chainweaver validate`` reports them with a line an editor can jump to. Only
files with a problem are located, so this re-reads their text rather than slowing down
the loader for every file.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

# An index or line of more than 9 digits is no index or line of a flow file (and int()
# refuses more than 4300 digits): such text is read as a name, or as no line.
_TOKEN = re.compile(r"\[([0-9]{1,9})\]|([^.\[\]]+)")
_LINE_IN_MESSAGE = re.compile(r"\bat line ([0-9]{1,9})(?![0-9])")
_DECODER = json.JSONDecoder()


def field_tokens(field: str) -> list[str | int]:
    """``steps[1].input_mapping.a`` -> ``["steps", 1, "input_mapping", "a"]``."""
    return [int(index) if index else name for index, name in _TOKEN.findall(field)]


def line_of(path: Path, field: str | None, message: str = "") -> int | None:
    """The line of ``field`` in the file at ``path``: the line a message gives
    (``at line 3``), else the line of the deepest part of the field that exists
    (line 1 for the whole flow). None when the file cannot be read or parsed."""
    given = _LINE_IN_MESSAGE.search(message)
    if given:
        return int(given.group(1))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    tokens = field_tokens(field) if field else []
    try:
        if path.suffix in (".yaml", ".yml"):
            return _yaml_line(text, tokens)
        return _json_line(text, tokens)
    except Exception:  # a file that does not parse has no lines to point at
        return None


# ------------------------------------------------------------------ YAML


@functools.lru_cache(maxsize=8)  # a file with several problems is composed once
def _yaml_tree(text: str) -> Any:
    import yaml

    # compose builds nodes (with their marks) but never values: safe on any text; the
    # file passed the reader's limits (nesting, no aliases) before it had a problem.
    # libyaml, when installed, composes a large file several times faster.
    return yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _yaml_line(text: str, tokens: list[str | int]) -> int | None:
    import yaml

    node: Any = _yaml_tree(text)
    if node is None:
        return None
    line = node.start_mark.line + 1
    position = 0
    while position < len(tokens):
        token = tokens[position]
        if isinstance(node, yaml.SequenceNode) and isinstance(token, int) \
                and token < len(node.value):
            node = node.value[token]
            line = node.start_mark.line + 1
            position += 1
            continue
        if not isinstance(node, yaml.MappingNode):
            break
        found = _mapping_entry(
            [(key.value, key, value) for key, value in node.value
             if isinstance(key, yaml.ScalarNode)], tokens, position)
        if found is None:
            break
        key, node, position = found
        line = key.start_mark.line + 1
    return line


def _mapping_entry(entries: list[tuple[str, Any, Any]], tokens: list[str | int],
                   position: int) -> tuple[Any, Any, int] | None:
    """The (key, value, next position) of the entry the tokens at ``position`` name.

    A key may itself hold dots (a JSON Schema property ``a.b``), so the longest run of
    tokens that is a key wins."""
    names = {name: (key, value) for name, key, value in entries}
    for end in range(len(tokens), position, -1):
        part = tokens[position:end]
        if not all(isinstance(token, str) for token in part):
            continue
        name = ".".join(str(token) for token in part)
        if name in names:
            key, value = names[name]
            return key, value, end
    return None


# ------------------------------------------------------------------ JSON


def _json_line(text: str, tokens: list[str | int]) -> int | None:
    position = _skip_space(text, 0)
    line_at = position
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if text.startswith("[", position) and isinstance(token, int):
            items = _json_items(text, position)
            if token >= len(items):
                break
            position = line_at = items[token]
            index += 1
            continue
        if not text.startswith("{", position):
            break
        found = _mapping_entry(_json_members(text, position), tokens, index)
        if found is None:
            break
        line_at, position, index = found
    return text.count("\n", 0, line_at) + 1


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _json_members(text: str, position: int) -> list[tuple[str, Any, Any]]:
    """(key, key position, value position) of each member of the object at ``position``."""
    members: list[tuple[str, Any, Any]] = []
    position = _skip_space(text, position + 1)
    while position < len(text) and text[position] == '"':
        key, end = json.decoder.scanstring(text, position + 1)  # type: ignore[attr-defined]
        value_at = _skip_space(text, _skip_space(text, end) + 1)  # past the ':'
        members.append((key, position, value_at))
        _, end = _DECODER.raw_decode(text, value_at)
        position = _skip_space(text, end)
        if not text.startswith(",", position):
            break
        position = _skip_space(text, position + 1)
    return members


def _json_items(text: str, position: int) -> list[int]:
    """The position of each item of the array at ``position``."""
    items = []
    position = _skip_space(text, position + 1)
    while position < len(text) and text[position] != "]":
        items.append(position)
        _, end = _DECODER.raw_decode(text, position)
        position = _skip_space(text, end)
        if not text.startswith(",", position):
            break
        position = _skip_space(text, position + 1)
    return items
