"""The static checks :func:`chainweaver.plan.compile_plan` makes of a flow, and the
:class:`Problem` each finds: a field or mapping nothing can feed, a retry on a step that
is not idempotent, two steps that may run at once writing the same key, an output schema
the context cannot fill, a fallback that ends the flow returning another model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from .flows import Flow, FlowStep
from .mapping_checks import input_type_problem
from .safety import ToolSafetyContract
from .tools import Tool


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a flow cannot run (``fatal``) or cannot succeed for some input."""

    kind: str
    message: str
    step_id: str | None = None
    field: str | None = None
    fatal: bool = False


class Source(Protocol):
    """What the checks read of where a field comes from (``plan.FieldSource``)."""

    field: str
    key: str
    mapped: bool
    required: bool
    candidates: tuple[int, ...]


class Step(Protocol):
    """What the checks read of a planned step (``plan.PlannedStep``)."""

    id: str
    label: str
    position: int
    writes: frozenset[str] | None
    fallback: Tool | None
    output_model: type[BaseModel] | None


def check_sources(label: str, step_id: str, sources: Sequence[Source],
                  input_keys: set[str] | None, problems: list[Problem]) -> None:
    if input_keys is None:
        return  # the flow input is unknown (its first tool is missing): reported already
    for source in sources:
        if source.candidates or source.key in input_keys:
            continue
        if source.mapped:
            problems.append(Problem(
                "MissingContextKeyError", f"{label} maps field {source.field!r} to context "
                f"key {source.key!r}, which neither the flow input nor an earlier step "
                "provides", step_id, source.field))
        elif source.required:
            problems.append(Problem(
                "MissingContextKeyError", f"{label} needs input field {source.field!r}, "
                "which neither the flow input, an earlier step, a mapping nor a default "
                "provides", step_id, source.field))


def check_condition(label: str, step_id: str, sources: Sequence[Source],
                    input_keys: set[str] | None, problems: list[Problem]) -> None:
    """A ``when`` name nothing can provide always reads None: a typo, never intended."""
    if input_keys is None:
        return
    for source in sources:
        if not source.candidates and source.key not in input_keys:
            problems.append(Problem(
                "MissingContextKeyError", f"{label} has a condition reading {source.key!r}, "
                "which neither the flow input nor a step it runs after provides (it would "
                "always be None)", step_id, source.key))


def check_input_types(label: str, step_id: str, sources: Sequence[Source],
                      input_model: type[BaseModel] | None, model: type[BaseModel] | None,
                      problems: list[Problem]) -> None:
    """A field fed as is by the flow input (no step writes its key first) must take
    every type the flow input accepts there, or an input the flow publishes as valid
    fails the step."""
    if input_model is None or model is None:
        return
    for source in sources:
        if source.candidates or source.key not in input_model.model_fields:
            continue
        why = input_type_problem(input_model, source.key, model, source.field)
        if why is not None:
            problems.append(Problem(
                "InputTypeError", f"{label} takes field {source.field!r} from the flow "
                f"input as is, but {why}: an input the flow accepts would fail the step",
                step_id, source.field))


def check_retry(label: str, step_id: str, step: FlowStep, tool: Tool | None,
                subflow: Flow | None,
                safety_of: Callable[[Flow], ToolSafetyContract | None],
                problems: list[Problem]) -> None:
    if step.retry is None or (tool is None and subflow is None):
        return
    # A sub-flow's own safety= is a claim for its callers; whether repeating it is safe
    # depends on what its tools really do.
    safety = tool.safety if tool is not None else safety_of(subflow)  # type: ignore[arg-type]
    if safety is None or not safety.idempotent:
        what = "unknown" if safety is None else "not idempotent"
        whose = ("its tool is {} by its safety contract" if tool else "its sub-flow's "
                 "tools and fallbacks are {} by their safety contracts, whatever the "
                 "sub-flow declares")
        problems.append(Problem(
            "RetryNotAllowedError", f"{label} has a retry policy, but {whose.format(what)} "
            "(a retried side effect could happen twice)", step_id, fatal=True))


def check_conflicts(planned: Sequence[Step], ancestors: list[int],
                    problems: list[Problem]) -> None:
    """Two steps that may run at the same time must not write the same context key."""
    for later in planned:
        if later.writes is None:
            continue
        for earlier in planned[:later.position]:
            if earlier.writes is None or ancestors[later.position] >> earlier.position & 1:
                continue
            shared = sorted(earlier.writes & later.writes)
            if shared:
                problems.append(Problem(
                    "ConflictingWritesError",
                    f"steps {earlier.id!r} and {later.id!r} may run at the same time and "
                    f"both write context key {shared[0]!r}; make one run after the other "
                    "or rename with output_mapping", later.id, shared[0], fatal=True))
                break  # one problem per step: n steps writing one key are not n*n lines


def check_output(flow: Flow, input_keys: set[str] | None,
                 writes: list[frozenset[str] | None], problems: list[Problem]) -> None:
    if flow.output_schema is None or input_keys is None or any(w is None for w in writes):
        return
    available = set(input_keys).union(*(w for w in writes if w is not None))
    for name, info in flow.output_schema.model_fields.items():
        if info.is_required() and name not in available:
            problems.append(Problem(
                "OutputValidationError", f"output_schema field {name!r} can be filled by "
                "neither the flow input nor any step's output", None, name))


def check_sink_fallback(sink: Step, problems: list[Problem]) -> None:
    """The last step's output is the flow's: a fallback there must return the same model,
    or the flow's advertised output would not hold when the fallback runs."""
    fallback = sink.fallback
    if fallback is None or sink.output_model is None \
            or fallback.output_schema is sink.output_model:
        return
    problems.append(Problem(
        "FallbackOutputError", f"{sink.label} ends the flow, and its fallback "
        f"{fallback.name!r} returns {_model_name(fallback.output_schema)}, not "
        f"{_model_name(sink.output_model)} like the step: give the flow an output_schema "
        "both fit, or a fallback returning the same model", sink.id))


def _model_name(model: type[BaseModel] | None) -> str:
    return "undeclared output" if model is None else model.__name__
