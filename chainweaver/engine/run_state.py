"""The state of one run of a plan: the flow input, each step's context writes and
records, the first failure, and what the async lane schedules by."""

from __future__ import annotations

import threading
import uuid
from time import perf_counter
from typing import Any, Protocol

from ..plan import Plan, PlannedStep
from ..results import ErrorInfo, StepRecord
from ..run_events import RunObserver
from ..step_guard import StepGuard


class Checkpointing(Protocol):
    """What a run asks of its checkpoints (``engine.durable.Durable``)."""

    def restore(self, state: RunState) -> None: ...

    async def started(self, planned: PlannedStep) -> None: ...

    async def finished(self, state: RunState, planned: PlannedStep) -> None: ...

    async def flush(self) -> None: ...

    def abandon(self) -> None: ...


class RunState:
    """One run of a plan: the flow input, each step's context writes, records, failure."""

    __slots__ = ("plan", "flow_input", "writes", "records", "started", "failure",
                 "failed_at", "waiting", "ready", "observer", "_lock", "begun",
                 "run_id", "durable", "guard", "validated_input")

    def __init__(self, plan: Plan, flow_input: dict[str, Any],
                 begun: float | None = None) -> None:
        self.plan = plan
        self.flow_input = flow_input
        count = len(plan.steps)
        self.writes: list[dict[str, Any] | None] = [None] * count
        self.records: list[StepRecord | None] = [None] * count
        self.started = 0  # how many records there are
        # Steps' started_ms count from here: when the run started (the lanes' clock
        # read, shared), else now.
        self.begun = perf_counter() if begun is None else begun
        self.failure: ErrorInfo | None = None
        self.failed_at = count
        self.waiting: list[int] = []
        self.ready: list[int] = []
        self.observer: RunObserver | None = None  # told about each step (run_events)
        self.run_id: str | None = None  # the key scope (made on first use when None)
        self.durable: Checkpointing | None = None  # checkpoints each step (checkpoints.py)
        # Asked before every attempt (chainweaver.grants); None: nothing to check.
        self.guard: StepGuard | None = None
        # The model the flow input was validated into, for a first step that takes
        # exactly it (PlannedStep.reuses_input); used once.
        self.validated_input: Any = None
        # Steps of the async lane fail in worker threads and on the loop at once
        # (made by schedule(): the sync lane runs one step at a time).
        self._lock: threading.Lock | None = None

    def scope(self) -> str:
        """The run's id as idempotency keys name it: given, or made once."""
        if self.run_id is None:
            self.run_id = uuid.uuid4().hex
        return self.run_id

    def schedule(self) -> None:
        """Prepare the bookkeeping the async lane starts ready steps by."""
        self._lock = threading.Lock()
        self.waiting = [len(step.depends) for step in self.plan.steps]
        self.ready = [step.position for step in reversed(self.plan.steps)
                      if not step.depends]  # pop() takes the earliest in plan order

    def fail(self, position: int, info: ErrorInfo) -> None:
        # Several branches may fail in the async lane: the earliest in plan order wins,
        # which is the failure the sync lane reports.
        if self._lock is None:  # the sync lane
            if position < self.failed_at:
                self.failure, self.failed_at = info, position
            return
        with self._lock:
            if position < self.failed_at:
                self.failure, self.failed_at = info, position

    def finish(self, position: int) -> None:
        """Mark a step done; its dependents whose steps are all done become ready."""
        for dependent in self.plan.steps[position].dependents:
            self.waiting[dependent] -= 1
            if self.waiting[dependent] == 0:
                self.ready.append(dependent)
        self.ready.sort(reverse=True)  # pop() takes the earliest in plan order

    def context(self) -> dict[str, Any]:
        """The final context: the flow input and every step's writes, in plan order."""
        context = dict(self.flow_input)
        for written in self.writes:
            if written:
                context.update(written)
        return context
