"""A step's data: its arguments gathered from the run's context (earlier steps' outputs,
then the flow's input), its input validated, its output checked and written back. Both
the step runner and the plain path (:mod:`.runner`) use these."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from ..mappings import MappingMiss, gather_computed
from ..plan import FieldSource, PlannedStep
from ..results import ErrorInfo, StepRecord
from ..tools import Keyed, Tool, step_key
from .run_state import RunState
from .step_failures import StepFailed, input_failed, output_failed, what, where


def complete(state: RunState, planned: PlannedStep, record: StepRecord,
              outputs: dict[str, Any]) -> None:
    record.outputs = outputs
    record.status = "completed"
    if planned.output_mapping:
        # Only the mapped keys reach the context; a field the output lacks is left out.
        outputs = {key: outputs[name] for key, name in planned.output_mapping
                   if name in outputs}
    state.writes[planned.position] = outputs


def lookup(state: RunState, source: FieldSource) -> tuple[bool, Any]:
    writes = state.writes
    for position in source.candidates:
        written = writes[position]
        if written is not None and source.key in written:
            return True, written[source.key]
    if source.key in state.flow_input:
        return True, state.flow_input[source.key]
    return False, None


def gather(state: RunState, planned: PlannedStep,
           sources: tuple[FieldSource, ...]) -> dict[str, Any]:
    arguments = {}
    writes = state.writes
    flow_input = state.flow_input
    for source in sources:
        key = source.key
        # lookup, inlined: this loop is the executor's hottest path.
        for position in source.candidates:
            written = writes[position]
            if written is not None and key in written:
                arguments[source.field] = written[key]
                break
        else:
            if key in flow_input:
                arguments[source.field] = flow_input[key]
            elif source.mapped:
                raise StepFailed(ErrorInfo(
                    "MissingContextKeyError",
                    f"{planned.label}: field {source.field!r} is mapped to context key "
                    f"{key!r}, which does not exist{_skipped(state, source)}",
                    **where(planned, field=source.field)))
            elif source.required and source.candidates:
                # Only steps that were skipped (or failed and were skipped) could provide it.
                raise StepFailed(ErrorInfo(
                    "MissingContextKeyError",
                    f"{planned.label}: required field {source.field!r} has no value"
                    f"{_skipped(state, source)}", **where(planned, field=source.field)))
    if planned.computed:  # fields fed by constants and JSON pointers
        try:
            gather_computed(planned.computed, writes, flow_input, arguments)
        except MappingMiss as miss:
            raise StepFailed(ErrorInfo("MissingContextKeyError", f"{planned.label}: {miss}",
                                       **where(planned, field=miss.field))) from None
    return arguments


def _skipped(state: RunState, source: FieldSource) -> str:
    skipped = [state.plan.steps[p].id for p in source.candidates
               if (record := state.records[p]) is not None and record.status == "skipped"]
    if not skipped:
        return ""
    return f" (only step(s) {', '.join(map(repr, skipped))} could provide it, and were skipped)"


def keyed(state: RunState, planned: PlannedStep, model: Any, *,
          fallback: bool = False) -> Keyed:
    """A keyed tool's call: its input and the key of this step, or of its ``fallback``
    (a key of its own, even when the fallback is the step's own tool). No step id holds
    '#' (flows.py), so no step's key is a fallback's."""
    path = f"{planned.id}#fallback" if fallback else planned.id
    return Keyed(model, step_key(state.scope(), path))


def step_input(state: RunState, planned: PlannedStep, tool: Tool,
               arguments: dict[str, Any]) -> Any:
    """The model ``tool`` is called with: the flow input's own validated model for a first
    step that takes exactly it (once: a retry validates afresh), else validated here."""
    if planned.reuses_input and tool is planned.tool and state.validated_input is not None:
        model, state.validated_input = state.validated_input, None
        return model
    return _validate_input(planned, tool, arguments)


def _validate_input(planned: PlannedStep, tool: Tool, arguments: dict[str, Any]) -> Any:
    try:
        # The validator itself: model_validate only wraps it.
        return tool.input_schema.__pydantic_validator__.validate_python(arguments)
    except Exception as error:
        raise input_failed(planned, tool, error) from None


def step_output(planned: PlannedStep, tool: Tool, raw: Any) -> dict[str, Any]:
    schema = tool.output_schema
    # ``type(raw) is not dict`` first: isinstance against a pydantic model class goes
    # through its metaclass's __instancecheck__, which costs more than a tool call.
    try:
        if schema is not None:
            if type(raw) is schema:
                return schema.__pydantic_serializer__.to_python(raw)
            if type(raw) is not dict and isinstance(raw, BaseModel):
                # Another model (or a subclass with extra fields): validate its data.
                raw = raw.model_dump()
            return schema.__pydantic_serializer__.to_python(
                schema.__pydantic_validator__.validate_python(raw))
        if type(raw) is not dict and isinstance(raw, BaseModel):
            return raw.model_dump()
    except Exception as error:
        raise output_failed(planned, tool, error) from None
    if type(raw) is dict or isinstance(raw, Mapping):
        return dict(raw)
    raise StepFailed(ErrorInfo(
        "StepOutputError", f"{what(planned, tool)} returned {type(raw).__name__}; a tool "
        "must return a dict or a pydantic model", **where(planned, tool.name)))
