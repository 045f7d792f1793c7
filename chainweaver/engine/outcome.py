"""Starting a run (checking the plan, validating the input) and building its result."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ValidationError

from ..flows import Flow
from ..plan import Plan
from ..results import ErrorInfo, ExecutionResult, StepRecord
from ..run_events import notify
from .run_state import RunState
from .step_failures import StepFailed, describe, first_error_field, raised


def start(plan: Plan, input: Mapping[str, Any] | BaseModel,
          begun: float | None = None) -> RunState:
    """The state of a new run of ``plan``; :class:`StepFailed` if it cannot start.
    ``begun``: when the run started (``perf_counter``; now when left out), which its
    steps' ``started_ms`` count from."""
    flow = plan.flow
    fatal = [problem for problem in plan.problems if problem.fatal] if plan.problems else None
    if fatal:
        problem = fatal[0]
        index = (flow.step_ids.index(problem.step_id)
                 if problem.step_id in flow.step_ids else None)
        step = flow.steps[index] if index is not None else None
        raise StepFailed(ErrorInfo(
            problem.kind, problem.message, step_index=index,
            tool_name=step.name if step else None, field=problem.field,
            step_id=problem.step_id))
    model = plan.input_model
    assert model is not None  # a plan without fatal problems has its first step's model
    try:
        # Exact class only: a subclass instance would carry undeclared fields into
        # the context, so it is dumped and validated like any other model.
        fresh = True  # a model validation made (never the caller's own instance)
        if type(input) is model:
            validated, fresh = input, False
        elif type(input) is not dict and isinstance(input, BaseModel):  # (see _output)
            validated = model.model_validate(input.model_dump())
        else:
            validated = model.__pydantic_validator__.validate_python(input)
        context = model.__pydantic_serializer__.to_python(validated)
    except ValidationError as error:
        detail = describe(error)
        raise StepFailed(ErrorInfo(
            "InputValidationError", f"flow {flow.name!r} input is invalid: {detail}",
            field=first_error_field(error), detail=detail,
        )) from None
    except Exception as error:  # a validator or serializer bug, not the caller's
        raise raised(f"flow {flow.name!r} input validation", error) from None
    state = RunState(plan, context, begun)
    if fresh and plan.steps[0].reuses_input:
        state.validated_input = validated
    return state

def finish(state: RunState, started: float) -> ExecutionResult:
    """The result of a run whose steps are done (or that failed)."""
    plan = state.plan
    flow = plan.flow
    if state.failure is not None:
        # What the sync lane records: the steps up to the first failure in plan order
        # (the async lane may have started later ones; they are left out).
        records = [record for record in state.records[:state.failed_at + 1]
                   if record is not None]
        return failed(flow, state.failure, [replace(r) for r in records], started)
    # Steps that never started have no record.
    records = [record for record in state.records if record is not None]
    if flow.output_schema is not None:
        fields = flow.output_schema.model_fields
        context = state.context()
        try:
            final = flow.output_schema.model_validate(
                {k: v for k, v in context.items() if k in fields}
            ).model_dump()
        except ValidationError as error:
            info = ErrorInfo("OutputValidationError",
                             f"flow {flow.name!r} output is invalid: {describe(error)}",
                             field=first_error_field(error))
            return failed(flow, info, records, started)
        except Exception as error:
            info = raised(f"flow {flow.name!r} output validation", error).info
            return failed(flow, info, records, started)
    else:
        sink = plan.steps[plan.sink]  # type: ignore[index]
        record = state.records[sink.position]
        if record is None or record.status != "completed":
            info = ErrorInfo("OutputValidationError",
                             f"flow {flow.name!r} has no output: its last step "
                             f"{sink.id!r} was skipped", step_index=sink.index,
                             tool_name=sink.step.name, step_id=sink.id)
            return failed(flow, info, records, started)
        final = record.outputs or {}
    return ExecutionResult(flow.name, flow.version, True, final, None, records,
                           (time.perf_counter() - started) * 1000)

def timed_out(state: RunState, timeout: float | None, started: float) -> ExecutionResult:
    """The result of a run that ran out of time: finished steps are kept."""
    flow = state.plan.flow
    records = [record for record in state.records if record is not None]
    running = [record for record in records if record.status == "running"]
    blamed = running[0] if running else (records[-1] if records else None)
    info = ErrorInfo(
        "TimeoutError", f"flow {flow.name!r} did not finish within {timeout} s",
        step_index=blamed.index if blamed else None,
        tool_name=blamed.tool_name if blamed else None,
        step_id=blamed.step_id if blamed else None)
    return failed(flow, info, _settled(records, info, state.begun), started)


def cancelled(state: RunState, started: float) -> ExecutionResult:
    """The result of a cancelled run: finished steps are kept, running ones cancelled."""
    flow = state.plan.flow
    records = [record for record in state.records if record is not None]
    running = [record for record in records if record.status == "running"]
    blamed = running[0] if running else None
    where = "" if blamed is None else f" during step {blamed.step_id!r}"
    info = ErrorInfo(
        "CancelledError", f"flow {flow.name!r} was cancelled{where}",
        step_index=blamed.index if blamed else None,
        tool_name=blamed.tool_name if blamed else None,
        step_id=blamed.step_id if blamed else None)
    settled = _settled(records, info, state.begun, "cancelled")
    if state.observer is not None:
        for record in settled:
            if record.status == "cancelled":
                notify(state.observer.step_finished, record)
    return failed(flow, info, settled, started)


def _settled(records: list[StepRecord], info: ErrorInfo, begun: float,
             status: str = "failed") -> list[StepRecord]:
    """Copies (a stuck worker thread may still write to the originals); a step still
    running when the run timed out (or was cancelled) gets ``status``, the run's error
    and how long it ran until then (the run began at ``begun``, ``perf_counter``)."""
    settled = []
    now_ms = (time.perf_counter() - begun) * 1000
    for record in records:
        copy = replace(record)
        if copy.status == "running":
            copy.status = status
            copy.error = info
            copy.duration_ms = max(0.0, now_ms - copy.started_ms)
        settled.append(copy)
    return settled


def failed(flow: Flow, info: ErrorInfo, records: list[StepRecord],
            started: float) -> ExecutionResult:
    return ExecutionResult(flow.name, flow.version, False, None, info, records,
                           (time.perf_counter() - started) * 1000)
