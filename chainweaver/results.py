"""What a run leaves: its result, each step's record, and why something failed.

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
