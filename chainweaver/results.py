"""What a run leaves: its result, each step's record, and why something failed; and how
they read as text (``chainweaver run``'s step table, the testing kit's failures).

Plain records with no behaviour, so the runner, the lanes, run events and everything
that reads a result share them without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a run (or a step) failed: an error type, a message, and where it happened."""

    type: str
    message: str
    step_index: int | None = None
    tool_name: str | None = None
    field: str | None = None
    step_id: str | None = None
    detail: str | None = None  # a validation error's description, without the "where"


@dataclass(slots=True)
class StepRecord:
    """What one step received and returned, how it ended and how long it took.

    ``status`` is ``"completed"``, ``"skipped"`` (its condition was false, or it failed
    with ``on_error="skip"``: then ``error`` says why), ``"failed"`` or ``"cancelled"``
    (it was running when the run was cancelled). ``attempts``
    counts tool calls (retries and a fallback included); ``attempt_errors`` holds the
    error of every failed attempt, in order; ``fallback`` names the fallback tool when
    it produced the output; ``steps`` holds a sub-flow's own step records (of its last
    attempt). ``started_ms`` is when the step started, in milliseconds after its run
    started (steps that ran at the same time overlap). ``restored``: the step ran in
    an earlier attempt of a durable run, and its outputs come from its checkpoint.
    """

    index: int
    tool_name: str
    inputs: dict[str, Any] | None = None
    outputs: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    duration_ms: float = 0.0
    step_id: str = ""
    status: str = "running"
    attempts: int = 0
    attempt_errors: tuple[ErrorInfo, ...] = ()
    fallback: str | None = None
    steps: list[StepRecord] | None = None
    started_ms: float = 0.0
    restored: bool = False


@dataclass(slots=True)
class ExecutionResult:
    """The outcome of one flow run."""

    flow_name: str
    flow_version: str
    success: bool
    final_output: dict[str, Any] | None
    error: ErrorInfo | None
    steps: list[StepRecord] = field(default_factory=list)
    duration_ms: float = 0.0


# ------------------------------------------------------------------ as text


def describe_error(error: ErrorInfo | None) -> str:
    """``at step 'x' (tool 't'), field 'f': Type: message``."""
    if error is None:
        return "no error recorded"
    where = []
    if error.step_id is not None:
        tool = f" (tool {error.tool_name!r})" if error.tool_name not in (None,
                                                                          error.step_id) else ""
        where.append(f"at step {error.step_id!r}{tool}")
    if error.field is not None:
        where.append(f"field {error.field!r}")
    prefix = ", ".join(where)
    return f"{prefix + ': ' if prefix else ''}{_typed(error)}"


def _typed(error: ErrorInfo) -> str:
    """The message, led by the error type unless it names it already."""
    return error.message if error.type in error.message else f"{error.type}: {error.message}"


def _rows(records: list[StepRecord], prefix: str = "") -> list[tuple[StepRecord, str]]:
    """Each record with its path; a sub-flow's steps follow their step (``outer/inner``)."""
    rows = []
    for record in records:
        path = prefix + (record.step_id or record.tool_name)
        rows.append((record, path))
        rows.extend(_rows(record.steps or [], path + "/"))
    return rows


def duration(ms: float) -> str:
    if ms < 10:
        return f"{ms:.2f} ms"
    return f"{ms:.1f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def step_table(result: ExecutionResult) -> str:
    """The steps as aligned columns: id, status, attempts, duration, and an error
    column when a step has one."""
    rows = _rows(result.steps)
    if not rows:
        return "no step ran"
    errors = any(record.error is not None for record, _ in rows)
    table = [["STEP", "STATUS", "ATTEMPTS", "DURATION", *(["ERROR"] if errors else [])]]
    for record, path in rows:
        status = record.status + (f" (fallback {record.fallback})" if record.fallback else "")
        cells = [path, status, str(record.attempts), duration(record.duration_ms)]
        table.append(cells + [_short(record.error)] if errors else cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths,
                                                                   strict=False)),
                                row[-1]]).rstrip() for row in table)


def _short(error: ErrorInfo | None) -> str:
    if error is None:
        return "-"
    where = f"field {error.field!r}: " if error.field else ""
    return where + _typed(error)
