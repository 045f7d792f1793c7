"""How a run uses its checkpoints (:mod:`chainweaver.checkpoints`): what it writes
before each dependent step starts, what it restores when run again with the same id, and
when it refuses to resume (another plan or input, unreadable entries, an interrupted
step that must not run twice)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import pydantic_core

from ..checkpoints import (
    INTERRUPTED,
    CheckpointMismatchError,
    CheckpointStore,
    CheckpointStoreError,
)
from ..plan import Plan, PlannedStep
from ..results import ErrorInfo, StepRecord
from ..run_events import notify
from .run_state import RunState
from .step_data import complete

_HEAD = "head"
_DONE = "done:"  # + step id: what the step gave (JSON)
_RUNNING = "run:"  # + step id: a step that must not run twice has started


def plan_fingerprint(plan: Plan) -> str:
    """A digest of what a resumed run relies on: the flow and version, and each step's
    id, tool or sub-flow (with its own plan), dependencies, mapping and fallback."""
    return hashlib.sha256(json.dumps(_shape(plan)).encode()).hexdigest()


def _shape(plan: Plan) -> list[Any]:
    steps = [[p.id, p.step.name, p.tool.name if p.tool else None, list(p.depends),
              [list(pair) for pair in p.output_mapping],
              p.fallback.name if p.fallback else None,
              _shape(p.subplan) if p.subplan is not None else None]
             for p in plan.steps]
    return [plan.flow.name, plan.flow.version, steps]


def rerunnable(planned: PlannedStep) -> bool:
    """May this step run again after being interrupted: every tool it may call (its
    own, its fallback's, a sub-flow's) is idempotent or takes the key."""
    if planned.fallback is not None and not planned.fallback.rerunnable:
        return False
    if planned.subplan is not None:
        return all(rerunnable(inner) for inner in planned.subplan.steps)
    return planned.tool is not None and planned.tool.rerunnable


class Durable:
    """One run's checkpoints: loaded once (:meth:`open`), restored into the run's state,
    then written as steps start (only those that must not run twice) and end.

    Writes go out one at a time, in order. The checkpoint of a step that may run again
    (:func:`rerunnable`) is written while the steps after it run; every other write is
    awaited: a step that must not run twice starts only once every earlier checkpoint
    and its own marker are stored, and its dependents only once its checkpoint is. So a
    process that dies before a rerunnable step's checkpoint is stored replays that step
    (and any step that ran meanwhile), never one that must not run twice. The run
    awaits every write before it returns (:meth:`flush`).
    """

    def __init__(self, store: CheckpointStore, run_id: str, head: dict[str, str],
                 entries: Mapping[str, bytes],
                 saved: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.entries = entries
        self.saved = saved or {}  # step id -> what it gave, read and checked by open()
        # Written with the first entry of a new run (one round trip fewer).
        self.pending_head: bytes | None = None if entries else json.dumps(head).encode()
        self.restored = 0
        self.writing: asyncio.Future[None] | None = None  # the last write sent

    @classmethod
    async def open(cls, store: CheckpointStore, run_id: str, state: RunState) -> Durable:
        """Load ``run_id``'s checkpoints; :class:`CheckpointMismatchError` when they
        were written by another flow version, plan or input."""
        plan = state.plan
        head = {"flow": plan.flow.name, "version": plan.flow.version,
                "plan": plan_fingerprint(plan), "input": hashlib.sha256(
                    pydantic_core.to_json(state.flow_input)).hexdigest()}
        try:
            entries = await store.load(run_id)
        except Exception as error:
            raise _store_failed(run_id, "load", error) from error
        if not entries:
            return cls(store, run_id, head, entries)
        _check(run_id, head, _read(run_id, "its head", entries[_HEAD])
               if _HEAD in entries else {})
        saved = {planned.id: _saved_step(run_id, planned, entries[_DONE + planned.id])
                 for planned in plan.steps if _DONE + planned.id in entries}
        return cls(store, run_id, head, entries, saved)

    def restore(self, state: RunState) -> None:
        """Put the checkpointed steps into ``state`` (they count as done), or fail the
        run when a step that must not run twice was interrupted."""
        if not self.entries:
            return
        done: set[int] = set()
        for planned in state.plan.steps:
            saved = self.saved.get(planned.id)
            if saved is not None:
                self._restore_step(state, planned, saved)
                done.add(planned.position)
            elif _RUNNING + planned.id in self.entries and not rerunnable(planned):
                _interrupted(state, planned)
                return
        self.restored = len(done)
        for position in sorted(done):
            state.finish(position)
        state.ready = sorted((p for p in state.ready if p not in done), reverse=True)

    def _restore_step(self, state: RunState, planned: PlannedStep, saved: dict) -> None:
        record = StepRecord(planned.index, planned.step.name, saved.get("inputs"),
                            step_id=planned.id, attempts=saved.get("attempts", 0),
                            fallback=saved.get("fallback"), restored=True)
        state.records[planned.position] = record
        state.started += 1
        if state.observer is not None:
            notify(state.observer.step_started, record)
        if saved["status"] == "completed":
            complete(state, planned, record, saved["outputs"])
        else:
            record.status = saved["status"]
            error = saved.get("error")
            record.error = ErrorInfo(**error) if error else None
        if state.observer is not None:
            notify(state.observer.step_finished, record)

    async def started(self, planned: PlannedStep) -> None:
        """Before a step runs: mark it, unless it may simply run again (then earlier
        checkpoints may still be on their way)."""
        if not rerunnable(planned):
            await self._save({_RUNNING + planned.id: b"1"})

    async def finished(self, state: RunState, planned: PlannedStep) -> None:
        """After a step ran (before its dependents start): checkpoint what it gave."""
        record = state.records[planned.position]
        if record is None or record.status not in ("completed", "skipped"):
            return  # failed: the run ends here
        saved = {"status": record.status, "outputs": record.outputs,
                 "inputs": record.inputs, "attempts": record.attempts,
                 "fallback": record.fallback,
                 "error": dataclasses.asdict(record.error) if record.error else None}
        try:
            data = pydantic_core.to_json(saved)
        except Exception as error:  # an output JSON cannot hold: it cannot be resumed
            info = ErrorInfo("CheckpointError", f"{planned.label} output cannot be "
                             f"checkpointed as JSON: {error}", step_index=planned.index,
                             tool_name=planned.step.name, step_id=planned.id)
            record.status, record.error = "failed", info
            state.fail(planned.position, info)
            return
        if rerunnable(planned):
            self._send({_DONE + planned.id: data})  # stored while its dependents run
        else:
            await self._save({_DONE + planned.id: data})

    async def flush(self) -> None:
        """Wait until every checkpoint sent so far is stored (CheckpointStoreError when
        one could not be)."""
        writing = self.writing
        if writing is not None:
            await writing

    def abandon(self) -> None:
        """The run ends otherwise (timed out, cancelled): stop the writes still under
        way (only checkpoints of steps that may run again; on resume they do)."""
        writing, self.writing = self.writing, None
        if writing is not None:
            writing.cancel()

    async def _save(self, entries: dict[str, bytes]) -> None:
        self._send(entries)
        await self.flush()

    def _send(self, entries: dict[str, bytes]) -> None:
        if self.pending_head is not None:
            entries[_HEAD] = self.pending_head
            self.pending_head = None
        self.writing = asyncio.ensure_future(self._write(self.writing, entries))

    async def _write(self, previous: asyncio.Future[None] | None,
                     entries: dict[str, bytes]) -> None:
        if previous is not None:
            await previous  # one write at a time, in order (a failure stops the rest)
        try:
            await self.store.save(self.run_id, entries)
        except Exception as error:
            raise _store_failed(self.run_id, "save", error) from error


def _store_failed(run_id: str, action: str, error: Exception) -> CheckpointStoreError:
    return CheckpointStoreError(f"run {run_id!r}: the checkpoint store could not {action} "
                                f"its checkpoints ({type(error).__name__})")


def _check(run_id: str, head: dict[str, str], saved: dict[str, str]) -> None:
    if (saved.get("flow"), saved.get("version")) != (head["flow"], head["version"]):
        raise CheckpointMismatchError(
            f"run {run_id!r} was checkpointed by flow {saved.get('flow')!r} "
            f"{saved.get('version')}, not {head['flow']!r} {head['version']}: it cannot "
            "resume (start a new run with another run id)")
    if saved.get("plan") != head["plan"]:
        raise CheckpointMismatchError(
            f"run {run_id!r} of flow {head['flow']!r} {head['version']} was checkpointed "
            "under another plan (a step, tool, mapping or sub-flow changed since): it "
            "cannot resume (start a new run with another run id)")
    if saved.get("input") != head["input"]:
        raise CheckpointMismatchError(
            f"run {run_id!r} of flow {head['flow']!r} {head['version']} was started with "
            "another input: it cannot resume with this one")


# What a step's checkpoint may hold besides its status (see Durable.finished).
_ERROR_FIELDS = frozenset(field.name for field in dataclasses.fields(ErrorInfo))


def _read(run_id: str, what: str, data: bytes) -> dict[str, Any]:
    """A checkpoint entry as the JSON object it must be; CheckpointMismatchError when
    it is not one (damaged, edited by hand, written by another release): a run never
    resumes from what it cannot read, nor takes a step it cannot read as done."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        value = None
    if not isinstance(value, dict):
        raise _unreadable(run_id, what, "not a JSON object")
    return value


def _saved_step(run_id: str, planned: PlannedStep, data: bytes) -> dict[str, Any]:
    """What a step's checkpoint says it gave, checked (see :func:`_read`)."""
    what = f"the checkpoint of {planned.label}"
    saved = _read(run_id, what, data)
    status, error = saved.get("status"), saved.get("error")
    attempts = saved.get("attempts", 0)
    if status not in ("completed", "skipped"):
        why = f"status {str(status)[:40]!r}"
    elif status == "completed" and not isinstance(saved.get("outputs"), dict):
        why = "its outputs are not a JSON object"
    elif not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
        why = "attempts is not a count"
    elif not isinstance(saved.get("fallback"), (str, type(None))):
        why = "fallback is not a name"
    elif error is not None and not (
            isinstance(error, dict) and set(error) <= _ERROR_FIELDS
            and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)):
        why = "its error cannot be read"
    else:
        return saved
    raise _unreadable(run_id, what, why)


def _unreadable(run_id: str, what: str, why: str) -> CheckpointMismatchError:
    return CheckpointMismatchError(
        f"run {run_id!r}: {what} cannot be read ({why}): it cannot resume (start a new "
        "run with another run id)")


def _interrupted(state: RunState, planned: PlannedStep) -> None:
    """Fail the run at ``planned``: it was running when the run stopped, and its tools
    could repeat an effect if it ran again."""
    info = ErrorInfo(
        INTERRUPTED, f"{planned.label} was interrupted while running a non-idempotent "
        "step: the run stopped during it, and it is not idempotent and takes no "
        "idempotency key, so it was not run again (nor was any step that completed)",
        step_index=planned.index, tool_name=planned.step.name, step_id=planned.id)
    record = StepRecord(planned.index, planned.step.name, None, None, info,
                        step_id=planned.id, status="failed")
    state.records[planned.position] = record
    state.started += 1
    state.fail(planned.position, info)
    if state.observer is not None:
        notify(state.observer.step_started, record)
        notify(state.observer.step_finished, record)
