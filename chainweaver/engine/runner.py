"""One step runner for both lanes, the run state it works on, and the run's records.

:func:`run_step` is a generator: it does everything a step needs (condition, inputs,
validation, retries, fallback, records, writing its outputs) and *yields* the few
things that differ between the lanes as requests: call a tool, sleep before a retry,
run a sub-flow. The sync lane answers them by calling directly; the async lane by
awaiting (async tools, sub-flows) or in a worker thread (sync tools). So the rules
live in one place and both lanes produce the same records. A step's data (its arguments,
input and output) is :mod:`.step_data`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Generator
from time import perf_counter
from typing import Any, Final, Literal, Protocol, cast

from pydantic import BaseModel

from ..conditions import ConditionError
from ..grants import Grants, StepKind, StepRequest
from ..plan import Plan, PlannedStep
from ..results import ErrorInfo, StepRecord
from ..retry import MAX_BACKOFF_SECONDS
from ..run_events import RunObserver, notify
from ..step_guard import StepGuard, StepRefused
from ..tools import Tool
from .approved import RENEWAL_DENIED
from .run_state import RunState
from .step_data import complete, gather, keyed, lookup, step_input, step_output
from .step_failures import (
    StepFailed,
    SubFlowFailed,
    call_failed,
    input_failed,
    output_failed,
    where,
)


class Stop(Protocol):
    """What a step needs of its run's stop signal (:class:`chainweaver.engine.calling.Stop`;
    named here so the runner stays below the calling module)."""

    def is_set(self) -> bool: ...


logger = logging.getLogger("chainweaver.executor")

# What a step yields to its lane, named by its first item. Plain tuples: one is built per
# tool call, and the lanes unpack them by name (see lanes.py, "answering steps").
CALL: Final = "call"
SLEEP: Final = "sleep"
FLOW: Final = "flow"
CHECK: Final = "check"
# (CALL, tool, arguments, timeout): call the tool; the reply is what it returned.
CallRequest = tuple[Literal["call"], Tool, BaseModel, "float | None"]
# (SLEEP, seconds): wait before a retry.
SleepRequest = tuple[Literal["sleep"], float]
# (FLOW, plan, input, timeout, run_id, guard): run a sub-flow, its steps checked by
# ``guard`` (None: unchecked); the reply is its ExecutionResult.
FlowRequest = tuple[Literal["flow"], Plan, "dict[str, Any]", "float | None", str,
                    "StepGuard | None"]
# (CHECK, guard, request): may this attempt run? The reply is None or why not.
CheckRequest = tuple[Literal["check"], StepGuard, StepRequest]
LaneRequest = CallRequest | SleepRequest | FlowRequest | CheckRequest


# ------------------------------------------------------------------ the step runner


def _begin(state: RunState, planned: PlannedStep) -> tuple[StepRecord, float]:
    """Record that ``planned`` starts (telling the observer); its start time."""
    record = StepRecord(planned.index, planned.name, None, None, None, 0.0, planned.id)
    state.records[planned.position] = record
    state.started += 1
    if state.observer is not None:
        notify(state.observer.step_started, record)
    started = perf_counter()
    record.started_ms = (started - state.begun) * 1000
    return record, started


def run_plain_step(state: RunState, planned: PlannedStep, stop: Stop | None = None) -> None:
    """:func:`run_step` for a plain step (``planned.plain``), answered by calling.

    The same record and outcome as the generator gives, without its overhead: most
    steps are plain, and this is the executor's hottest path. Once ``stop`` is set
    (the async call that started it is over) the tool is not called, as in
    ``Lanes._drive_sync``: the record stays "running" for the run's outcome to settle.
    """
    tool = planned.tool
    assert tool is not None
    record, started = _begin(state, planned)
    observer = state.observer
    try:
        arguments = gather(state, planned, planned.sources)
        record.inputs = arguments
        model = step_input(state, planned, tool, arguments)
        if stop is not None and stop.is_set():
            return
        record.attempts = 1
        try:
            raw = tool.fn(keyed(state, planned, model) if tool.takes_key else model)
        except (Exception, asyncio.CancelledError) as error:  # a tool's failure is data
            raise call_failed(planned, tool, error) from None
        complete(state, planned, record, step_output(planned, tool, raw))
    except StepFailed as failure:
        record.error = failure.info
        record.status = "failed"
        state.fail(planned.position, failure.info)
    finally:
        record.duration_ms = (perf_counter() - started) * 1000
        if observer is not None and record.status != "running":
            notify(observer.step_finished, record)


def run_plain_chain(state: RunState, stop: Stop | None = None) -> None:
    """Every step of a plain plan (``plan.plain``) in one tight loop, with no observer.

    What :func:`run_plain_step` does step by step, with the step's validator prepared
    by the plan and one clock read between two steps (the end of one is the start of
    the next). Stops at the first failure, or (the tool not called) once ``stop`` is set.
    """
    records, writes, begun = state.records, state.writes, state.begun
    now = perf_counter()
    for planned in state.plan.steps:
        tool = planned.tool
        assert tool is not None
        record = StepRecord(planned.index, planned.name, None, None, None, 0.0, planned.id)
        record.started_ms = (now - begun) * 1000
        records[planned.position] = record
        state.started += 1
        started = now
        try:
            arguments = gather(state, planned, planned.sources)
            record.inputs = arguments
            model = state.validated_input
            if model is None or not planned.reuses_input:
                try:
                    model = planned.validate_input(arguments)
                except Exception as error:
                    raise input_failed(planned, tool, error) from None
            else:
                state.validated_input = None
            if stop is not None and stop.is_set():
                record.duration_ms = (perf_counter() - started) * 1000
                return
            record.attempts = 1
            try:
                raw = tool.fn(keyed(state, planned, model) if tool.takes_key else model)
            except (Exception, asyncio.CancelledError) as error:  # a tool's failure is data
                raise call_failed(planned, tool, error) from None
            check_output = planned.check_output
            if check_output is not None and type(raw) is dict:
                # step_output's commonest case, with the validator and serializer the plan
                # prepared (the same work, without the call).
                try:
                    outputs = planned.dump_output(check_output(raw))
                except Exception as error:
                    raise output_failed(planned, tool, error) from None
            else:
                outputs = step_output(planned, tool, raw)
        except StepFailed as failure:
            record.error = failure.info
            record.status = "failed"
            record.duration_ms = (perf_counter() - started) * 1000
            state.fail(planned.position, failure.info)
            return
        record.outputs = outputs
        record.status = "completed"
        if planned.output_mapping:
            outputs = {key: outputs[name] for key, name in planned.output_mapping
                       if name in outputs}
        writes[planned.position] = outputs
        now = perf_counter()
        record.duration_ms = (now - started) * 1000


def run_step(state: RunState, planned: PlannedStep) -> Generator[LaneRequest, Any, None]:
    """Run one step of ``state``'s plan, yielding tool calls, sleeps and sub-flow runs."""
    step = planned.step
    record, started = _begin(state, planned)
    observer = state.observer
    try:
        if planned.condition is not None and not _condition_holds(state, planned):
            record.status = "skipped"
            return
        arguments = gather(state, planned, planned.sources)
        record.inputs = arguments
        if step.retry is None and planned.tool is not None:
            # The common case, without a nested generator: one call of one tool.
            tool = planned.tool
            if state.guard is not None:
                model = yield from _checked_input(state, planned, "tool", tool, arguments,
                                                  planned.grants, 1)
            else:
                model = step_input(state, planned, tool, arguments)
            if tool.takes_key:
                model = keyed(state, planned, model)
            record.attempts = 1
            try:
                raw = yield (CALL, tool, model, step.timeout)
            except (Exception, asyncio.CancelledError) as error:  # the lane decides
                raise call_failed(planned, tool, error) from None
            outputs = step_output(planned, tool, raw)
        else:
            outputs = yield from _attempts(state, planned, arguments, record, observer)
        complete(state, planned, record, outputs)
    except StepRefused as refused:
        _refused(state, planned, record, refused)
    except StepFailed as failure:
        record.error = failure.info
        if step.on_error == "fallback" and planned.fallback is not None \
                and record.inputs is not None:
            try:
                outputs = yield from _call_tool(state, planned, planned.fallback,
                                                record.inputs, record, fallback=True)
            except StepRefused as refused:
                record.attempt_errors += (failure.info,)
                _refused(state, planned, record, refused)
                return
            except StepFailed as second:
                record.attempt_errors += (failure.info,)
                record.error = second.info
            else:
                record.attempt_errors += (failure.info,)
                record.error = None
                record.fallback = planned.fallback.name
                complete(state, planned, record, outputs)
                return
        if step.on_error == "skip":
            record.status = "skipped"
        else:
            record.status = "failed"
            state.fail(planned.position, record.error)
    finally:
        record.duration_ms = (perf_counter() - started) * 1000
        # A step closed where it stood (its run is over) is still "running": the
        # run's outcome settles and reports it.
        if observer is not None and record.status != "running":
            notify(observer.step_finished, record)


def _checked(state: RunState, planned: PlannedStep, kind: StepKind, target: str,
             tool: Tool | None, arguments: dict[str, Any], grants: Grants | None,
             attempt: int) -> Generator[LaneRequest, Any, None]:
    """Ask the run's guard whether this attempt may run now (raises StepRefused)."""
    guard = state.guard
    assert guard is not None
    safety = tool.safety if tool is not None \
        else planned.subflow.safety if planned.subflow is not None else None
    request = guard.request(guard.path(planned.id), kind, target, tool, safety, arguments,
                            grants, attempt)
    try:
        refused = yield (CHECK, guard, request)
    except Exception:  # the lane could not ask: refuse, never run unchecked
        logger.debug("step check of %s failed", planned.label, exc_info=True)
        refused = "step_authorizer_error"
    if refused is not None:
        raise StepRefused(refused, request.path)


def _checked_input(state: RunState, planned: PlannedStep, kind: StepKind, tool: Tool,
                   arguments: dict[str, Any], grants: Grants | None, attempt: int
                   ) -> Generator[LaneRequest, Any, Any]:
    """The model ``tool`` is called with in this attempt, once the run's guard allowed
    it. The step authorizer is asked with the arguments the tool will actually get
    (defaults filled in, values coerced and normalised by the tool's input model), not
    the ones gathered from the context. Input that does not validate fails the step,
    but a refusal comes first: a caller refused the step never learns what its input
    validation says."""
    guard = state.guard
    assert guard is not None
    try:
        model = step_input(state, planned, tool, arguments)
    except StepFailed:
        yield from _checked(state, planned, kind, tool.name, tool, arguments, grants,
                            attempt)
        raise
    if guard.authorizer is not None:  # only the hook reads the arguments
        arguments = tool.input_schema.__pydantic_serializer__.to_python(model)
    yield from _checked(state, planned, kind, tool.name, tool, arguments, grants, attempt)
    return model


def _refused(state: RunState, planned: PlannedStep, record: StepRecord,
             refused: StepRefused) -> None:
    """A step the guard refused: the run stops here (no skip, retry or fallback)."""
    guard = state.guard
    own = guard.path(planned.id) if guard is not None else planned.id
    inner = f" (at step {refused.path!r})" if refused.path != own else ""
    if refused.reason == RENEWAL_DENIED:
        # Still allowed, but not as approved: asked again, and not approved.
        approved = guard.approved if guard is not None else None
        why = approved.denial if approved is not None and approved.denial else \
            "its step-grant decision changed after the run was approved"
        record.error = ErrorInfo("ApprovalDenied", f"{planned.label}{inner}: {why}, so "
                                 "it did not run", **where(planned), detail=RENEWAL_DENIED)
        record.status = "failed"
        state.fail(planned.position, record.error)
        return
    record.error = ErrorInfo(
        "StepRefused", f"{planned.label}{inner} was refused for this caller "
        f"({refused.reason}); it did not run", **where(planned),
        detail=refused.reason)
    record.status = "failed"
    state.fail(planned.position, record.error)


def _condition_holds(state: RunState, planned: PlannedStep) -> bool:
    values = {}
    for source in planned.condition_sources:
        found, value = lookup(state, source)
        if found:
            values[source.key] = value
    try:
        return planned.condition.evaluate(values)  # type: ignore[union-attr]
    except ConditionError as error:
        raise StepFailed(ErrorInfo("ConditionError", f"{planned.label}: {error}",
                                   **where(planned))) from None


def _attempts(state: RunState, planned: PlannedStep, arguments: dict[str, Any],
              record: StepRecord, observer: RunObserver | None
              ) -> Generator[LaneRequest, Any, dict[str, Any]]:
    retry = planned.step.retry
    errors: list[ErrorInfo] = []  # added to the record once: no tuple rebuilt per attempt
    attempt = 0
    try:
        while True:
            attempt += 1
            try:
                if planned.subflow is not None:
                    return (yield from _call_flow(state, planned, arguments, record))
                return (yield from _call_tool(state, planned, planned.tool, arguments,
                                              record))
            except StepFailed as failure:
                if retry is None or attempt >= retry.max_attempts or failure.cause is None \
                        or not retry.retries(failure.cause):
                    raise
                errors.append(failure.info)
                if observer is not None:
                    notify(observer.step_retrying, record, failure.info)
            try:
                yield (SLEEP, sleep_seconds(retry.delay(attempt)))
            except Exception:  # a wait that cannot happen must not end the run
                logger.debug("retry backoff of %s failed", planned.label, exc_info=True)
    finally:
        if errors:
            record.attempt_errors += tuple(errors)


def sleep_seconds(delay: Any) -> float:
    """A backoff the lanes can sleep: from 0 to twice the longest allowed (with jitter)."""
    if isinstance(delay, (int, float)) and 0 <= delay <= 2 * MAX_BACKOFF_SECONDS:
        return float(delay)
    if isinstance(delay, (int, float)) and delay > 0:  # too long (or infinite)
        return 2.0 * MAX_BACKOFF_SECONDS
    return 0.0  # negative, NaN or not a number


def _call_tool(state: RunState, planned: PlannedStep, tool: Tool | None,
               arguments: dict[str, Any], record: StepRecord, *, fallback: bool = False
               ) -> Generator[LaneRequest, Any, dict[str, Any]]:
    """Call ``tool``: the step's own, or its ``fallback`` (said, not told by the tool:
    a step may fall back to its own tool)."""
    assert tool is not None  # plans with missing tools never run
    if state.guard is not None:
        model = yield from _checked_input(
            state, planned, "fallback" if fallback else "tool", tool, arguments,
            planned.fallback_grants if fallback else planned.grants, record.attempts + 1)
    else:
        model = step_input(state, planned, tool, arguments)
    if tool.takes_key:
        model = keyed(state, planned, model, fallback=fallback)
    record.attempts += 1
    try:
        raw = yield (CALL, tool, model, planned.step.timeout)
    except (Exception, asyncio.CancelledError) as error:  # the lane decides
        raise call_failed(planned, tool, error) from None
    return step_output(planned, tool, raw)


def _call_flow(state: RunState, planned: PlannedStep, arguments: dict[str, Any],
               record: StepRecord) -> Generator[LaneRequest, Any, dict[str, Any]]:
    guard = state.guard
    inner_guard = None
    subplan = cast(Plan, planned.subplan)  # compiled with the sub-flow it runs
    if guard is not None:
        yield from _checked(state, planned, "subflow", subplan.flow.name, None, arguments,
                            planned.grants, record.attempts + 1)
        inner_guard = guard.inner(planned.id, tuple(subplan.flow.delegations))
    record.attempts += 1
    # The sub-flow's steps are keyed within this step: stable across redeliveries too.
    result = yield (FLOW, subplan, arguments, planned.step.timeout,
                    f"{state.scope()}/{planned.id}", inner_guard)
    record.steps = result.steps
    if result.success:
        return dict(result.final_output or {})
    inner = result.error
    if inner_guard is not None and (inner.type == "StepRefused"
                                    or inner.detail == RENEWAL_DENIED):
        # A step inside the sub-flow was refused: the whole run stops there too.
        raise StepRefused(inner.detail or "forbidden", _inner_path(inner_guard, result))
    # The sub-flow's input comes from this flow's context, not from the caller: invalid,
    # it is this step's input that is wrong (as for a tool).
    kind = "StepInputError" if inner.type == "InputValidationError" else inner.type
    raise StepFailed(ErrorInfo(
        kind, f"{planned.label}: sub-flow {planned.step.flow!r} failed: {inner.message}",
        **where(planned, field=inner.field), detail=inner.detail), SubFlowFailed(kind))


def _inner_path(guard: Any, result: Any) -> str:
    """The path of the refused step inside a sub-flow's run (its deepest record)."""
    path = guard.prefix
    records = result.steps
    while records:
        last = records[-1]
        path += last.step_id
        if last.steps and last.error is not None and (
                last.error.type == "StepRefused" or last.error.detail == RENEWAL_DENIED):
            path += "/"
            records = last.steps
        else:
            break
    return path
