"""Flows: versioned, governed DAGs of tool steps (a list of steps is a linear flow)."""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Literal, get_args

from pydantic import BaseModel

from .conditions import Condition
from .errors import (
    DefinitionError,
    LifecycleTransitionError,
    PromptDefinitionError,
    member_of,
)
from .grants import Delegation, Grants, delegations_of
from .mappings import MappingSource, input_mapping_of
from .prompts import FlowPrompt, repeated_names
from .retry import RetryPolicy
from .safety import ToolSafetyContract
from .tools import check_model, check_name
from .versions import version_key

# Checking a flow's graph grows with the square of its steps: past this a flow is a
# mistake (or a file written to stall whoever loads it), not a workflow.
MAX_STEPS = 1000

# A step id is text (shown in reports, graphs and records) and a part of step paths
# ('/' joins a sub-flow's step ids) and of derived names ('#': a fallback's idempotency
# key is its step's id + "#fallback", a hidden sub-flow step is shown as
# "subflow#<index>"), so neither can be part of an id.
STEP_ID_PATTERN = r"^[^/#\u0000-\u001f\u007f-\u009f]+$"
_NOT_IN_IDS = re.compile(r"[/#\x00-\x1f\x7f-\x9f]")


class FlowLifecycle(Enum):
    """Where a flow stands in review: ``draft -> reviewed -> active -> archived``."""

    DRAFT = "draft"
    REVIEWED = "reviewed"
    ACTIVE = "active"
    ARCHIVED = "archived"

    def __str__(self) -> str:
        return self.value


# A reviewed flow may go back to draft for changes; archiving is final.
ALLOWED_TRANSITIONS: Mapping[FlowLifecycle, frozenset[FlowLifecycle]] = MappingProxyType({
    FlowLifecycle.DRAFT: frozenset({FlowLifecycle.REVIEWED, FlowLifecycle.ARCHIVED}),
    FlowLifecycle.REVIEWED: frozenset(
        {FlowLifecycle.DRAFT, FlowLifecycle.ACTIVE, FlowLifecycle.ARCHIVED}
    ),
    FlowLifecycle.ACTIVE: frozenset({FlowLifecycle.ARCHIVED}),
    FlowLifecycle.ARCHIVED: frozenset(),
})


@dataclass(frozen=True)
class FlowGovernance:
    """Who owns a flow, where it is in its lifecycle, and whether it may be published.

    ``publish=False`` is the author's own veto: no server publishes the flow, whatever
    its policy says (``force_expose`` included), in any primitive. The flow still runs
    in-process and as another flow's sub-flow.

    ``withheld`` is the operators' veto, set by shared governance
    (:mod:`chainweaver.governance`), never by a flow file: why no server publishes this
    version (say, its shared entry cannot be read). Like ``publish=False`` it comes
    before every policy setting; ``exposure_report()`` gives it as the reason.
    """

    lifecycle: FlowLifecycle = FlowLifecycle.ACTIVE
    owner: str | None = None
    publish: bool = True
    withheld: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lifecycle", member_of(FlowLifecycle, self.lifecycle, "lifecycle"))
        if not isinstance(self.publish, bool):
            raise DefinitionError(f"governance publish must be True or False, got "
                                  f"{self.publish!r}")
        if self.withheld is not None and (not isinstance(self.withheld, str)
                                          or not self.withheld.strip()):
            raise DefinitionError(f"governance withheld must be None or a reason, got "
                                  f"{self.withheld!r}")

    def transition(self, target: FlowLifecycle | str) -> FlowGovernance:
        """Return a new governance value in ``target``, if the move is allowed."""
        target = member_of(FlowLifecycle, target, "lifecycle")
        if target not in ALLOWED_TRANSITIONS[self.lifecycle]:
            allowed = ", ".join(sorted(t.value for t in ALLOWED_TRANSITIONS[self.lifecycle]))
            raise LifecycleTransitionError(
                f"cannot move a flow from {self.lifecycle.value!r} to {target.value!r}"
                f" (allowed: {allowed or 'none'})"
            )
        return replace(self, lifecycle=target)


ON_ERROR_CHOICES = ("fail", "skip", "fallback")
# A step's timeout: a month at most (the event loop's clock cannot add 1e300 seconds).
MAX_TIMEOUT_SECONDS = 30 * 86400


@dataclass(frozen=True)
class FlowStep:
    """One step of a flow: a tool (or a registered sub-flow) and how it is wired.

    ``input_mapping`` maps a tool input field to the context key that feeds it, a
    ``Pointer`` into the context or a ``Const`` (:mod:`chainweaver.mappings`);
    fields not in the mapping read the context key of the same name, if any.
    ``after`` lists the ids this step waits for (``None``: the previous step in the
    list; ``()``: none). ``when`` is a condition in the safe ``when`` language;
    ``output_mapping`` maps context keys to output fields (only those are written).
    ``requires`` adds grants the caller must hold for this step (beside its tool's,
    its fallback's and its sub-flow's own; see ``docs/step-grants.md``).
    """

    tool_name: str | None = None
    input_mapping: Mapping[str, MappingSource] = field(default_factory=dict)
    _: KW_ONLY
    id: str | None = None
    after: Sequence[str] | None = None
    when: str | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None
    on_error: str = "fail"
    fallback: str | None = None
    output_mapping: Mapping[str, str] = field(default_factory=dict)
    flow: str | None = None
    requires: Grants | None = None
    condition: Condition | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.tool_name is None) == (self.flow is None):
            raise DefinitionError("a step needs exactly one of a tool name or flow=")
        if self.flow is not None:
            check_name("flow", self.flow)
        else:
            check_name("tool", self.tool_name)
        label = f"step {self.id or self.name!r}"
        object.__setattr__(self, "input_mapping", input_mapping_of(label, self.input_mapping))
        object.__setattr__(self, "output_mapping",
                           _string_mapping(label, "output_mapping", self.output_mapping))
        if self.id is not None and (not isinstance(self.id, str) or not self.id):
            raise DefinitionError(f"{label}: id must be a non-empty string")
        if self.id is not None and _NOT_IN_IDS.search(self.id):
            raise DefinitionError(f"{label}: id must not hold '/' (it joins the ids of a "
                                  "sub-flow's steps: 'outer/inner'), '#' (it names a "
                                  "fallback's key and a hidden sub-flow: 'subflow#1') or "
                                  "control characters")
        if self.after is not None:
            if isinstance(self.after, str):
                raise DefinitionError(f"{label}: after must be a list of step ids, "
                                      f"not the string {self.after!r}")
            if isinstance(self.after, (bytes, Mapping)) or not isinstance(self.after, Iterable):
                raise DefinitionError(f"{label}: after must be a list of step ids, got "
                                      f"{type(self.after).__name__}")
            after = tuple(self.after)
            if not all(isinstance(item, str) for item in after):
                raise DefinitionError(f"{label}: after must list step ids (strings)")
            if len(set(after)) != len(after):
                raise DefinitionError(f"{label}: after lists a step id twice")
            object.__setattr__(self, "after", after)
        if self.when is not None:
            try:
                object.__setattr__(self, "condition", Condition(self.when))
            except DefinitionError as error:
                raise DefinitionError(f"{label}: {error}") from None
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise DefinitionError(f"{label}: retry must be a RetryPolicy")
        if self.timeout is not None and (
                isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float))
                or not 0 < self.timeout <= MAX_TIMEOUT_SECONDS):
            raise DefinitionError(f"{label}: timeout must be a positive number of seconds, "
                                  f"at most {MAX_TIMEOUT_SECONDS}")
        if self.on_error not in ON_ERROR_CHOICES:
            raise DefinitionError(f"{label}: on_error must be one of "
                                  f"{', '.join(ON_ERROR_CHOICES)}, got {self.on_error!r}")
        if (self.on_error == "fallback") != (self.fallback is not None):
            raise DefinitionError(f"{label}: on_error='fallback' and fallback= go together")
        if self.fallback is not None:
            check_name("tool", self.fallback)
        object.__setattr__(self, "requires", Grants.of(self.requires, f"{label}: requires"))

    @property
    def name(self) -> str:
        """The tool name, or the sub-flow name for a sub-flow step."""
        return self.tool_name if self.tool_name is not None else self.flow  # type: ignore[return-value]


def _string_mapping(label: str, what: str, value: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise DefinitionError(f"{label}: {what} must be a mapping of strings, got "
                              f"{type(value).__name__}")
    mapping = dict(value)
    for source, target in mapping.items():
        if not isinstance(source, str) or not isinstance(target, str):
            raise DefinitionError(f"{label}: {what} keys and values must be strings")
    return MappingProxyType(mapping)


TaskMode = Literal["forbidden", "optional", "required"]
TASK_MODES: tuple[str, ...] = get_args(TaskMode)


def check_task_mode(where: str, mode: object, *, optional: bool = True) -> None:
    """``mode`` is one of :data:`TASK_MODES` (or ``None``, the server's default)."""
    if mode is None and optional:
        return
    if mode not in TASK_MODES:
        raise DefinitionError(f"{where}: task_mode must be one of {', '.join(TASK_MODES)}"
                              f"{' or None' if optional else ''}, got {mode!r}")


@dataclass(frozen=True)
class Flow:
    """A named, versioned DAG of steps with governance and safety metadata.

    Built flows know their graph: ``step_ids`` (declaration order), ``dependencies``
    (per step, the declaration indices it runs after), ``order`` (a topological order,
    ties broken by declaration) and ``sink`` (the one step nothing runs after, or
    ``None`` when several do; then ``output_schema`` is required).
    """

    name: str
    description: str
    steps: Sequence[FlowStep]
    version: str = "1.0.0"
    title: str | None = None
    input_schema: type[BaseModel] | None = None
    output_schema: type[BaseModel] | None = None
    governance: FlowGovernance = field(default_factory=FlowGovernance)
    safety: ToolSafetyContract | None = None
    prompts: Sequence[FlowPrompt] = ()
    # May an MCP client run it as a background task? None: the server's default.
    task_mode: TaskMode | None = None
    # What a caller must hold to run this flow (as a sub-flow too), and the steps it
    # runs on its own grant (docs/step-grants.md).
    requires: Grants | None = None
    delegations: Sequence[Delegation] = ()
    step_ids: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    dependencies: tuple[tuple[int, ...], ...] = field(default=(), init=False, repr=False,
                                                       compare=False)
    order: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _sinks: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name("flow", self.name)
        version_key(self.version)  # raises InvalidVersionError
        if isinstance(self.steps, (str, bytes, Mapping)) \
                or not isinstance(self.steps, Iterable):
            raise DefinitionError(f"flow {self.name!r}: steps must be a list of FlowStep "
                                  f"values, got {type(self.steps).__name__}")
        steps = tuple(self.steps)
        if not steps:
            raise DefinitionError(f"flow {self.name!r} needs at least one step")
        if len(steps) > MAX_STEPS:
            raise DefinitionError(f"flow {self.name!r} has {len(steps)} steps, more than "
                                  f"{MAX_STEPS} (MAX_STEPS): split it into sub-flows")
        for index, step in enumerate(steps):
            if not isinstance(step, FlowStep):
                got = type(step).__name__
                hint = f" {step!r} (write FlowStep({step!r}))" if isinstance(step, str) else ""
                raise DefinitionError(f"flow {self.name!r}: steps[{index}] must be a FlowStep, "
                                      f"got {got}{hint}")
        object.__setattr__(self, "steps", steps)
        _set_graph(self, steps)
        check_model(f"flow {self.name!r}", "input_schema", self.input_schema, optional=True)
        check_model(f"flow {self.name!r}", "output_schema", self.output_schema, optional=True)
        if not isinstance(self.governance, FlowGovernance):
            raise DefinitionError(f"flow {self.name!r}: governance must be a FlowGovernance")
        if self.safety is not None and not isinstance(self.safety, ToolSafetyContract):
            raise DefinitionError(f"flow {self.name!r}: safety must be a ToolSafetyContract")
        prompts = tuple(self.prompts)
        if not all(isinstance(p, FlowPrompt) for p in prompts):
            raise PromptDefinitionError(f"flow {self.name!r}: prompts must be FlowPrompt values")
        duplicates = repeated_names(p.name for p in prompts)
        if duplicates:
            raise PromptDefinitionError(
                f"flow {self.name!r}: duplicate prompt name(s) {', '.join(duplicates)}"
            )
        object.__setattr__(self, "prompts", prompts)
        check_task_mode(f"flow {self.name!r}", self.task_mode)
        object.__setattr__(self, "requires",
                           Grants.of(self.requires, f"flow {self.name!r}: requires"))
        delegations = delegations_of(self.delegations, f"flow {self.name!r}: delegations")
        for delegation in delegations:
            head = delegation.step.split("/", 1)[0]
            if head not in self.step_ids:
                raise DefinitionError(
                    f"flow {self.name!r}: delegation names step {head!r}, which the flow "
                    f"does not have (ids: {', '.join(self.step_ids)})")
            if "/" in delegation.step and self.steps[self.step_ids.index(head)].flow is None:
                raise DefinitionError(
                    f"flow {self.name!r}: delegation path {delegation.step!r} goes into "
                    f"step {head!r}, which runs a tool, not a sub-flow")
        object.__setattr__(self, "delegations", delegations)
        if self.sink is None and self.output_schema is None:
            raise DefinitionError(
                f"flow {self.name!r}: steps {', '.join(repr(self.step_ids[i]) for i in self.sinks)}"
                " all end the flow (nothing runs after them); give the flow an output_schema"
                " to say what it returns, or join them with a final step")

    @property
    def sinks(self) -> tuple[int, ...]:
        """Declaration indices of the steps no other step runs after."""
        return self._sinks

    @property
    def sink(self) -> int | None:
        sinks = self.sinks
        return sinks[0] if len(sinks) == 1 else None

    @property
    def version_key(self) -> tuple:
        return version_key(self.version)

    @property
    def display_title(self) -> str:
        """``title``, or the name made readable (``order_lookup`` -> ``Order Lookup``)."""
        if self.title:
            return self.title
        return " ".join(w.capitalize() for w in self.name.replace("-", "_").replace(".", "_")
                        .split("_") if w)


def _set_graph(flow: Flow, steps: tuple[FlowStep, ...]) -> None:
    """Resolve step ids and ``after`` into the flow's graph; reject bad ids and cycles."""
    where = f"flow {flow.name!r}"
    names = [step.name for step in steps]
    ids: list[str] = []
    for index, step in enumerate(steps):
        if step.id is not None:
            ids.append(step.id)
        elif names.count(step.name) == 1:
            ids.append(step.name)
        else:
            raise DefinitionError(
                f"{where}: {step.name!r} is used by several steps; give each an id "
                f"(FlowStep({step.name!r}, id=...), step {index} has none)")
    seen: dict[str, int] = {}
    for index, step_id in enumerate(ids):
        if step_id in seen:
            raise DefinitionError(f"{where}: steps {seen[step_id]} and {index} have the same "
                                  f"id {step_id!r}; ids must be unique")
        seen[step_id] = index
    dependencies: list[tuple[int, ...]] = []
    for index, step in enumerate(steps):
        if step.after is None:
            dependencies.append((index - 1,) if index else ())
            continue
        resolved = []
        for target in step.after:
            if target not in seen:
                raise DefinitionError(f"{where}: step {ids[index]!r} runs after unknown step "
                                      f"id {target!r} (ids: {', '.join(ids)})")
            if target == ids[index]:
                raise DefinitionError(f"{where}: step {target!r} cannot run after itself")
            resolved.append(seen[target])
        dependencies.append(tuple(resolved))
    object.__setattr__(flow, "step_ids", tuple(ids))
    object.__setattr__(flow, "dependencies", tuple(dependencies))
    object.__setattr__(flow, "order", _topological_order(where, ids, dependencies))
    used = {index for deps in dependencies for index in deps}
    object.__setattr__(flow, "_sinks", tuple(i for i in range(len(steps)) if i not in used))
    _check_mapped_writes(where, flow)


def _check_mapped_writes(where: str, flow: Flow) -> None:
    """Steps with output mappings write known keys: two that may run at the same time
    must not write the same one. (Other writes depend on the tools; the executor checks
    them when it plans the flow.)"""
    ancestors: dict[int, set[int]] = {}
    for index in flow.order:
        ancestors[index] = set()
        for dep in flow.dependencies[index]:
            ancestors[index] |= ancestors[dep] | {dep}
    mapped = [i for i in flow.order if flow.steps[i].output_mapping]
    for position, later in enumerate(mapped):
        for earlier in mapped[:position]:
            if earlier in ancestors[later]:
                continue
            shared = sorted(set(flow.steps[earlier].output_mapping)
                            & set(flow.steps[later].output_mapping))
            if shared:
                raise DefinitionError(
                    f"{where}: steps {flow.step_ids[earlier]!r} and {flow.step_ids[later]!r}"
                    f" may run at the same time and both write context key {shared[0]!r}; "
                    "make one run after the other or map to different keys")


def _topological_order(where: str, ids: list[str],
                       dependencies: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Kahn's algorithm; among ready steps the earliest declared goes first."""
    waiting = [len(deps) for deps in dependencies]
    dependents: list[list[int]] = [[] for _ in ids]
    for index, deps in enumerate(dependencies):
        for dep in deps:
            dependents[dep].append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for dependent in dependents[index]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, dependent)
    if len(order) != len(ids):
        stuck = [ids[i] for i, count in enumerate(waiting) if count > 0]
        raise DefinitionError(f"{where}: the steps {', '.join(map(repr, stuck))} wait for "
                              "each other in a cycle (check their after= lists)")
    return tuple(order)
