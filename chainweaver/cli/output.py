"""How ``chainweaver`` commands write what they report: the program name that leads their
lines on stderr, aligned tables, and JSON documents for scripts."""

from __future__ import annotations

import json
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
