"""How ``chainweaver`` commands write what they report: the program name that leads their
lines on stderr, aligned tables, and JSON documents for scripts."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

PROG = "chainweaver"


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows (a header first) as left-aligned columns two spaces apart; the last column is
    not padded and no line ends in spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)),
                       row[-1]]).rstrip() for row in rows]


def json_text(document: Any) -> str:
    """``document`` as every command prints JSON: indented by two spaces."""
    return json.dumps(document, indent=2)


def shown(value: object) -> str:
    """``value`` as a cell a terminal prints as it is: text that is empty, or holds
    whitespace, quotes, backslashes or characters that do not print (a caller id
    from a token, or anything read back from a shared store, may hold an escape
    sequence, a newline or a lone surrogate) is shown as a Python string literal, so
    no record can move the cursor, colour the terminal or print a row of its own."""
    text = str(value)
    plain = text.isprintable() and not any(c.isspace() or c in "'\"\\" for c in text)
    return text if text and plain else repr(text)


def when(stamp: object, *, millis: bool = False) -> str:
    """A time read back from a store as local time (``-`` when there is none, ``?``
    when it is not a time a calendar holds: damaged, or written by hand)."""
    if stamp is None:
        return "-"
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool) \
            or not math.isfinite(stamp):
        return "?"
    try:
        text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    except (OverflowError, OSError, ValueError):
        return "?"
    return text + f".{int(stamp % 1 * 1000):03d}" if millis else text


def printed(value: object) -> str:
    """Free text (a reason, a message) read back from a store, as a terminal prints it:
    as it is when every character prints (spaces included), else as a Python string
    literal (an escape sequence, a newline, a lone surrogate)."""
    text = str(value)
    return text if text.isprintable() else repr(text)
