"""Compiling a flow into an executable plan (its static checks: :mod:`chainweaver.plan_checks`).

A :class:`Plan` holds the flow's steps in topological order (ties by declaration) with
everything a run needs resolved once: each step's tool (or sub-flow), the candidate
sources of every input field and condition name (the ancestor steps that may write that
context key, latest in plan order first; the flow input comes last), and which context
keys each step writes. A step sees the flow input and the outputs of the steps it comes
after (directly or not), merged in plan order, so what it reads never depends on timing.

:func:`compile_plan` returns the plan and a list of :class:`Problem` values. *Fatal*
problems (a missing tool or sub-flow, a recursive sub-flow, a retry on a non-idempotent
step, two steps that may run at once writing the same key) make the flow unrunnable;
the others are data-flow findings (a required field nothing can provide, a mapping to a
key that can never exist, an output schema the context cannot fill): the flow can still
run (and fail at run time), but an MCP server does not publish it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from .conditions import Condition
from .flow_input import derived_input_model
from .flows import Flow, FlowStep
from .grants import Grants, union
from .mapping_checks import check_computed
from .mappings import ComputedSource, Const, Pointer
from .plan_checks import (
    Problem,
    check_condition,
    check_conflicts,
    check_input_types,
    check_output,
    check_retry,
    check_sink_fallback,
    check_sources,
)
from .safety import ToolSafetyContract
from .tools import Tool

MAX_SUBFLOW_DEPTH = 32  # sub-flows within sub-flows: deeper is a mistake (and a deep stack)


# The plan's parts are never changed after compile_plan builds them. They are not
# frozen dataclasses only because those take four times as long to build, and every
# exposure decision compiles every flow.


@dataclass(slots=True)
class FieldSource:
    """Where one input field (or condition name) of a step comes from at run time."""

    field: str
    key: str
    mapped: bool
    required: bool
    candidates: tuple[int, ...]  # plan positions that may write ``key``, latest first


@dataclass(slots=True)
class PlannedStep:
    position: int
    index: int
    id: str
    label: str  # "step 1 ('fetch_order')", used in every message about the step
    step: FlowStep
    tool: Tool | None
    subflow: Flow | None
    subplan: Plan | None  # the sub-flow's plan, run as compiled here
    input_model: type[BaseModel] | None
    output_model: type[BaseModel] | None
    fallback: Tool | None
    sources: tuple[FieldSource, ...]
    condition: Condition | None
    condition_sources: tuple[FieldSource, ...]
    depends: tuple[int, ...]
    dependents: tuple[int, ...]
    writes: frozenset[str] | None  # None: unknown (an undeclared output)
    output_mapping: tuple[tuple[str, str], ...]
    # A sync tool that may block (a blocking fallback too): the async lane runs the step
    # in a worker thread.
    runs_in_thread: bool
    # A sync tool with no condition, retry, timeout or fallback and on_error "fail": the
    # lanes run it without a generator (runner.run_plain_step, runner.run_plain_chain).
    plain: bool
    computed: tuple[ComputedSource, ...] = ()  # fields fed by constants and pointers
    # Declared grants (chainweaver.grants): of the step's tool or sub-flow (with the
    # step's own), and of its fallback (with the step's own). None: none declared.
    grants: Grants | None = None
    fallback_grants: Grants | None = None
    # A sync tool declared non-blocking, with no timeout or retry wait and no blocking
    # fallback: the async lane runs it on the event loop.
    inline: bool = False
    # Prepared once per plan: the tool's input validator (validate_python), and whether
    # the step takes exactly the flow's validated input (runner: "reused input").
    validate_input: Any = None
    reuses_input: bool = False
    name: str = ""  # step.name (its tool's or sub-flow's), read once per run for its record
    # The tool's output validator (validate_python) and serializer (to_python), for the
    # plain loop (None: no tool, or no output schema).
    check_output: Any = None
    dump_output: Any = None


@dataclass(frozen=True, slots=True)
class GrantNeed:
    """A grant a run of the plan may ask its caller for: at ``path`` (``""``: the flow
    itself), before a ``kind`` of attempt (``tool``, ``fallback``, ``subflow``,
    ``flow``) of ``target``; ``delegated``: the reason a flow runs it on its own grant."""

    path: str
    kind: str
    target: str
    grants: Grants
    delegated: str | None = None


@dataclass(slots=True)
class Plan:
    flow: Flow
    steps: tuple[PlannedStep, ...]
    sink: int | None  # plan position of the single sink, if any
    input_model: type[BaseModel] | None
    # Every sub-flow (and theirs, transitively) as resolved (None: none to run): a new
    # active version of any of them makes the plan stale.
    subflow_versions: tuple[tuple[str, str | None], ...]
    problems: tuple[Problem, ...] = ()  # what compile_plan found (fatal ones stop a run)
    # What one approval of a run covers, once asked (run_events.approval_request): a
    # 1-tuple holding the ApprovalRequest, or None in it when no step needs approval.
    approval: tuple[Any] | None = field(default=None, repr=False, compare=False)
    # Every declared grant on every path (sub-flows and fallbacks included): a run
    # with a caller checks them (and asks the step authorizer) only when there are any.
    needs: tuple[GrantNeed, ...] = ()
    required: Grants | None = None  # what a caller must hold, delegated steps aside
    # Every step plain, each after the one before it, all in the same place (worker
    # thread or event loop): the lanes run them in one tight loop (runner.run_plain_chain).
    # Anything that must act between steps (an observer, a cancellation, a per-step
    # check) takes the step-by-step path instead, where it has its place.
    plain: bool = False


# How compile_plan looks things up (the executor passes its own).
class Resolver:
    def __init__(self, tools: Mapping[str, Tool], get_flow: Callable[[str], Flow | None],
                 input_model: Callable[[Flow], type[BaseModel] | None],
                 output_model: Callable[[Flow], type[BaseModel] | None],
                 safety: Callable[[Flow], ToolSafetyContract | None],  # merged over the tools
                 check: Callable[[Flow, tuple[str, ...]], tuple[Plan, list[Problem]]],
                 registered: Callable[[str], bool] = lambda name: False) -> None:
        self.tools = tools
        self.get_flow = get_flow
        self.input_model = input_model
        self.output_model = output_model
        self.safety = safety
        self.check = check
        self.registered = registered  # whether any version of a flow name is registered


def step_label(flow: Flow, index: int) -> str:
    step = flow.steps[index]
    step_id = flow.step_ids[index]
    if step_id == step.name:
        return f"step {index} ({step_id!r})"
    return f"step {index} ({step_id!r}, {'flow' if step.flow else 'tool'} {step.name!r})"


def compile_plan(flow: Flow, resolver: Resolver,
                 stack: tuple[str, ...] = ()) -> tuple[Plan, list[Problem]]:
    """The plan of ``flow`` and every problem found; ``stack`` holds enclosing flows."""
    problems: list[Problem] = []
    position_of = {index: position for position, index in enumerate(flow.order)}
    ancestors = _ancestors(flow, position_of)
    versions: list[tuple[str, str | None]] = []
    targets = [_resolve(flow, index, resolver, stack, problems, versions)
               for index in flow.order]
    writes = [_writes(flow, index, tool, subflow, fallback, resolver, problems)
              for index, (tool, subflow, fallback, _) in zip(flow.order, targets, strict=True)]
    input_model = _input_model(flow, resolver, targets[0][3])
    input_keys = None if input_model is None else set(input_model.model_fields)

    dependents: list[list[int]] = [[] for _ in flow.order]
    for position, index in enumerate(flow.order):
        for dep in flow.dependencies[index]:
            dependents[position_of[dep]].append(position)

    planned: list[PlannedStep] = []
    for position, index in enumerate(flow.order):
        step = flow.steps[index]
        tool, subflow, fallback, subplan = targets[position]
        label = step_label(flow, index)
        step_id = flow.step_ids[index]
        if subflow is not None:
            model = subplan.input_model if subplan is not None \
                else resolver.input_model(subflow)
            output_model = resolver.output_model(subflow)
        else:
            model = tool.input_schema if tool else None
            output_model = tool.output_schema if tool else None
        lineage = [p for p in range(position - 1, -1, -1) if ancestors[position] >> p & 1]

        def candidates(key: str, lineage: list[int] = lineage) -> tuple[int, ...]:
            return tuple(p for p in lineage if _may_write(writes[p], key))

        sources = []
        computed: list[ComputedSource] = []
        if model is not None:
            mapping = step.input_mapping
            for name, info in model.model_fields.items():
                key = mapping.get(name, name)
                if isinstance(key, (Const, Pointer)):
                    computed.append(ComputedSource(name, key, () if isinstance(key, Const)
                                                   else candidates(key.root)))
                    continue
                sources.append(FieldSource(name, key, name in mapping, info.is_required(),
                                           candidates(key)))
            for name in mapping:
                if name not in model.model_fields:
                    problems.append(Problem(
                        "UnknownFieldError",
                        f"{label} maps field {name!r}, which the "
                        f"{'flow' if subflow else 'tool'}'s input does not have "
                        f"(its fields: {', '.join(model.model_fields) or 'none'})",
                        step_id, name))
        condition_sources: tuple[FieldSource, ...] = ()
        if step.condition is not None:
            condition_sources = tuple(FieldSource(name, name, False, False, candidates(name))
                                      for name in step.condition.names)
        check_sources(label, step_id, sources, input_keys, problems)
        check_condition(label, step_id, condition_sources, input_keys, problems)
        check_input_types(label, step_id, sources, input_model, model, problems)
        problems.extend(Problem(kind, message, step_id, field) for kind, message, field
                        in check_computed(label, model, computed, planned, input_model))
        check_retry(label, step_id, step, tool, subflow, resolver.safety, problems)
        planned.append(PlannedStep(
            position, index, step_id, label, step, tool, subflow, subplan, model, output_model,
            fallback, tuple(sources), step.condition, condition_sources,
            tuple(position_of[d] for d in flow.dependencies[index]),
            tuple(dependents[position]), writes[position],
            tuple(step.output_mapping.items()),
            _runs_in_thread(tool, fallback),
            tool is not None and not tool.is_async and step.condition is None
            and step.retry is None and step.timeout is None and fallback is None
            and step.on_error == "fail",
            tuple(computed),
            union(step.requires, subflow.requires if subflow is not None
                  else tool.requires if tool is not None else None),
            union(step.requires, fallback.requires) if fallback is not None else None,
            _inline(step, tool, fallback),
            tool.input_schema.__pydantic_validator__.validate_python if tool else None,
            position == 0 and tool is not None and tool.input_schema is input_model
            and not step.input_mapping and not computed and step.condition is None
            and not any(source.candidates for source in sources),
            step.name,
            *_output_checks(tool),
        ))

    check_conflicts(planned, ancestors, problems)
    check_output(flow, input_keys, writes, problems)
    if flow.sink is not None and flow.output_schema is None:
        check_sink_fallback(planned[position_of[flow.sink]], problems)
    needs = _grant_needs(flow, planned, problems)
    sink = flow.sink
    plan = Plan(flow, tuple(planned), None if sink is None else position_of[sink],
                input_model, tuple(dict.fromkeys(versions)), tuple(problems),
                needs=needs,
                required=union(*(need.grants for need in needs if need.delegated is None)),
                # A declared grant is checked between steps: not the tight loop.
                plain=_plain_chain(planned) and not needs)
    return plan, problems


def _grant_needs(flow: Flow, planned: list[PlannedStep], problems: list[Problem]
                 ) -> tuple[GrantNeed, ...]:
    """Every grant a run may ask for, each with the delegation that covers it, if any
    (the flow's own delegations; a sub-flow's came with its plan)."""
    needs: list[GrantNeed] = []
    if flow.requires is not None:
        needs.append(GrantNeed("", "flow", flow.name, flow.requires))
    for step in planned:
        if step.grants is not None:
            needs.append(GrantNeed(step.id, "subflow" if step.subflow else "tool",
                                   step.step.name, step.grants))
        if step.fallback_grants is not None and step.fallback is not None:
            needs.append(GrantNeed(step.id, "fallback", step.fallback.name,
                                   step.fallback_grants))
        if step.subplan is not None:
            for inner in step.subplan.needs:
                if inner.kind != "flow":  # the sub-flow's own: the step's, above
                    needs.append(GrantNeed(f"{step.id}/{inner.path}", inner.kind,
                                           inner.target, inner.grants, inner.delegated))
    if not flow.delegations:
        return tuple(needs)
    paths = set(_step_paths(planned))
    for delegation in flow.delegations:
        if delegation.step not in paths:
            problems.append(Problem(
                "UnknownDelegationError", f"delegation names step path "
                f"{delegation.step!r}, which no step of the flow (or of its sub-flows) "
                "has", delegation.step.split("/", 1)[0], fatal=True))
    return tuple(need if need.delegated is not None else GrantNeed(
        need.path, need.kind, need.target, need.grants,
        next((d.reason for d in flow.delegations if need.path and d.covers(need.path)),
             None)) for need in needs)


def _step_paths(steps: list[PlannedStep] | tuple[PlannedStep, ...]) -> list[str]:
    """Every step path of a plan's ``steps``, its sub-flows' steps included."""
    paths = []
    for step in steps:
        paths.append(step.id)
        if step.subplan is not None:
            paths.extend(f"{step.id}/{inner}" for inner in _step_paths(step.subplan.steps))
    return paths


def _runs_in_thread(tool: Tool | None, fallback: Tool | None) -> bool:
    """A sync tool that may block, or whose fallback may (an async tool's step awaits
    and hands a blocking fallback to a worker thread itself)."""
    return tool is not None and not tool.is_async \
        and (tool.blocking or (fallback is not None and fallback.blocking))


def _inline(step: FlowStep, tool: Tool | None, fallback: Tool | None) -> bool:
    """A non-blocking sync tool, nothing of the step waiting (a timeout needs a thread to
    abandon, a retry sleeps) and no fallback that is async or blocks."""
    return tool is not None and not tool.is_async and not tool.blocking \
        and step.timeout is None and step.retry is None \
        and (fallback is None or not (fallback.is_async or fallback.blocking))


def _output_checks(tool: Tool | None) -> tuple[Any, Any]:
    """The tool's output validator and serializer (None, None: no output schema)."""
    schema = tool.output_schema if tool is not None else None
    if schema is None:
        return None, None
    return (schema.__pydantic_validator__.validate_python,
            schema.__pydantic_serializer__.to_python)


def _plain_chain(steps: list[PlannedStep]) -> bool:
    """Every step plain, each after the one before it only, all run in one place."""
    return bool(steps) and all(
        planned.plain and planned.depends == ((position - 1,) if position else ())
        and planned.runs_in_thread == steps[0].runs_in_thread
        for position, planned in enumerate(steps))


def _input_model(flow: Flow, resolver: Resolver, first_subplan: Plan | None
                 ) -> type[BaseModel] | None:
    """The flow's own input model, else its first step's (a sub-flow's as planned),
    less what that step feeds with constants and pointers (:mod:`chainweaver.flow_input`)."""
    if flow.input_schema is not None:
        return flow.input_schema
    base = first_subplan.input_model if first_subplan is not None \
        else resolver.input_model(flow)
    return None if base is None else derived_input_model(flow, base)


def _ancestors(flow: Flow, position_of: dict[int, int]) -> list[int]:
    """Per plan position, a bit set of the plan positions it (transitively) runs after."""
    result = [0] * len(flow.order)
    for position, index in enumerate(flow.order):
        bits = 0
        for dep in flow.dependencies[index]:
            dep_position = position_of[dep]
            bits |= result[dep_position] | (1 << dep_position)
        result[position] = bits
    return result


def _resolve(flow: Flow, index: int, resolver: Resolver, stack: tuple[str, ...],
             problems: list[Problem], versions: list[tuple[str, str | None]],
             ) -> tuple[Tool | None, Flow | None, Tool | None, Plan | None]:
    step = flow.steps[index]
    step_id = flow.step_ids[index]
    tool = subflow = fallback = subplan = None
    if step.flow is not None:
        label = step_label(flow, index)
        if step.flow in stack or step.flow == flow.name:
            chain = " -> ".join((*stack, flow.name, step.flow))
            problems.append(Problem("RecursiveFlowError", f"{label} runs flow {step.flow!r} "
                                    f"recursively ({chain})", step_id, fatal=True))
        elif len(stack) >= MAX_SUBFLOW_DEPTH:
            problems.append(Problem(
                "SubFlowDepthError", f"{label} runs flow {step.flow!r} more than "
                f"{MAX_SUBFLOW_DEPTH} sub-flow levels deep ({stack[0]} -> ... -> "
                f"{flow.name})", step_id, fatal=True))
        else:
            subflow = resolver.get_flow(step.flow)
            if subflow is None:
                versions.append((step.flow, None))  # registering one makes the plan stale
                if resolver.registered(step.flow):
                    problems.append(Problem(
                        "FlowNotFoundError", f"{label} uses flow {step.flow!r}, which has no "
                        "active version (only active flows run as sub-flows)", step_id,
                        fatal=True))
                else:
                    problems.append(Problem("FlowNotFoundError", f"{label} uses unregistered "
                                            f"flow {step.flow!r}", step_id, fatal=True))
            else:
                inner_plan, inner = resolver.check(subflow, (*stack, flow.name))
                subplan = inner_plan
                versions.append((subflow.name, subflow.version))
                versions.extend(inner_plan.subflow_versions)
                if inner:
                    # The first problem only: nested sub-flows would repeat theirs at every
                    # level (exponentially many when a sub-flow is used twice per level).
                    more = f" (and {len(inner) - 1} more)" if len(inner) > 1 else ""
                    problems.append(Problem(
                        "InvalidSubFlowError", f"{label}: sub-flow {step.flow!r} is invalid: "
                        f"{inner[0].message}{more}", step_id, fatal=True))
                    subflow = subplan = None
    else:
        tool = resolver.tools.get(step.tool_name)  # type: ignore[arg-type]
        if tool is None:
            problems.append(Problem("ToolNotFoundError", f"step {index} uses unregistered "
                                    f"tool {step.tool_name!r}"
                                    f"{_did_you_mean(step.tool_name, resolver.tools)}",
                                    step_id, fatal=True))
    if step.fallback is not None:
        fallback = resolver.tools.get(step.fallback)
        if fallback is None:
            problems.append(Problem("ToolNotFoundError", f"{step_label(flow, index)} falls "
                                    f"back to unregistered tool {step.fallback!r}"
                                    f"{_did_you_mean(step.fallback, resolver.tools)}",
                                    step_id, fatal=True))
    return tool, subflow, fallback, subplan


def _did_you_mean(name: str | None, known: Mapping[str, Tool]) -> str:
    """`` (did you mean 'x'?)`` for the registered tool closest to a misspelt ``name``."""
    close = difflib.get_close_matches(name or "", list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_keys(model: type[BaseModel] | None) -> frozenset[str] | None:
    return None if model is None else frozenset(model.model_fields)


def _writes(flow: Flow, index: int, tool: Tool | None, subflow: Flow | None,
            fallback: Tool | None, resolver: Resolver,
            problems: list[Problem]) -> frozenset[str] | None:
    """The context keys a step writes (None: unknown)."""
    step = flow.steps[index]
    if subflow is not None:
        produced = _model_keys(resolver.output_model(subflow))
    elif tool is not None:
        produced = _model_keys(tool.output_schema)
    else:
        produced = frozenset()  # unrunnable; reported already
    if fallback is not None and produced is not None:
        extra = _model_keys(fallback.output_schema)
        produced = None if extra is None else produced | extra
    if not step.output_mapping:
        return produced
    if produced is not None:
        for key, output_field in step.output_mapping.items():
            if output_field not in produced:
                problems.append(Problem(
                    "UnknownFieldError", f"{step_label(flow, index)} maps output field "
                    f"{output_field!r} (to context key {key!r}), which its output does not "
                    "have", flow.step_ids[index], output_field))
    return frozenset(step.output_mapping)


def _may_write(keys: frozenset[str] | None, key: str) -> bool:
    """Whether a step writing ``keys`` (None: undeclared, anything) may write ``key``."""
    return keys is None or key in keys
