"""Showing that :func:`~chainweaver.plan.compile_plan` would find no problem in a flow,
without compiling it.

Deciding whether a server publishes a flow needs to know whether the flow has
problems, not its plan: the plan is needed only when the flow runs. Compiling every
plan made the first list of a large catalogue slow (about 0.1 ms per flow), so the
exposure decision asks :func:`clean_input_model` first and compiles only when it
cannot answer.

It answers for the common shape: tool steps whose tools, fallbacks and models are all
declared, mapped from plain context keys. For anything else (a sub-flow step, a
constant or pointer, an undeclared model, a missing tool) it answers None, "compile to
know", and so it does wherever a check of ``compile_plan`` would report a problem:
it only ever proves a flow clean, never finds it faulty, so every problem and its
words still come from ``compile_plan`` alone. Each check below mirrors one there; a
property test over random flows holds the two together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from .flows import Flow, FlowStep
from .mapping_checks import derived_input_model
from .tools import Tool

# model -> (its field names, its required field names); models are few and live long.
_FIELDS: dict[type[BaseModel], tuple[frozenset[str], frozenset[str]]] = {}
_MAX_MODELS = 4096
# A step's tool, its tool's required input fields, and the context keys the step writes.
_Facts = tuple[Tool, frozenset[str], frozenset[str]]
# tool -> (its input fields, its required ones, its output fields), for tools that
# declare their output (tools are immutable)
_TOOLS: dict[Tool, tuple[frozenset[str], frozenset[str], frozenset[str]]] = {}
# steps -> the dependencies of a linear flow of that many steps (each after the one before)
_CHAINS: dict[int, tuple[tuple[int, ...], ...]] = {}


def _fields(model: type[BaseModel]) -> tuple[frozenset[str], frozenset[str]]:
    known = _FIELDS.get(model)
    if known is None:
        if len(_FIELDS) >= _MAX_MODELS:
            _FIELDS.clear()
        fields = model.model_fields
        known = _FIELDS[model] = (frozenset(fields), frozenset(
            name for name, info in fields.items() if info.is_required()))
    return known


def _tool_facts(tool: Tool) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """A tool's input fields, its required ones, and its output fields."""
    if len(_TOOLS) >= _MAX_MODELS:
        _TOOLS.clear()
    assert tool.output_schema is not None
    known = _TOOLS[tool] = (*_fields(tool.input_schema), _fields(tool.output_schema)[0])
    return known


def _chain(length: int) -> tuple[tuple[int, ...], ...]:
    chain = _CHAINS.get(length)
    if chain is None:
        chain = _CHAINS[length] = ((),) + tuple((index,) for index in range(length - 1))
    return chain


def clean_input_model(flow: Flow, tools: Mapping[str, Tool]) -> type[BaseModel] | None:
    """The input model of ``flow``'s plan when ``compile_plan`` over ``tools`` would
    report no problem at all; None when that is not shown here (then compile to know).
    """
    steps = flow.steps
    if flow.requires is not None or flow.delegations:
        return None  # step grants: the plan says what a caller must hold
    facts: list[_Facts] = []  # per declaration index
    for step in steps:
        tool = tools.get(step.tool_name) if step.flow is None else None  # type: ignore[arg-type]
        if tool is None:
            return None  # a sub-flow or a missing tool
        fallback = tools.get(step.fallback) if step.fallback is not None else None
        if step.requires is not None or tool.requires is not None \
                or (fallback is not None and fallback.requires is not None):
            return None  # step grants: the plan says what a caller must hold
        known = _TOOLS.get(tool)
        if known is None:
            if tool.output_schema is None:
                return None  # an undeclared output
            known = _tool_facts(tool)
        fields, required, produced = known
        writes = produced
        if step.fallback is not None or step.retry is not None or step.output_mapping:
            special = _writes(step, tool, tools, produced)
            if special is None:
                return None
            writes = special
        for name, source in step.input_mapping.items():
            if not isinstance(source, str) or name not in fields:
                return None  # a constant or pointer, or UnknownFieldError
        facts.append((tool, required, writes))
    input_model = flow.input_schema if flow.input_schema is not None \
        else derived_input_model(flow, facts[flow.order[0]][0].input_schema)
    input_keys = _fields(input_model)[0]
    if flow.dependencies == _chain(len(steps)):
        clean = _chain_clean(steps, facts, input_keys)
    else:
        clean = _dag_clean(flow, facts, input_keys)
    if not clean:
        return None
    if flow.output_schema is not None:
        written = input_keys.union(*(writes for _, _, writes in facts))
        if not _fields(flow.output_schema)[1] <= written:
            return None  # OutputValidationError
    else:
        sink = steps[-1] if clean == "chain" else steps[flow.sink]  # type: ignore[index]
        if sink.fallback is not None and tools[sink.fallback].output_schema \
                is not tools[sink.tool_name].output_schema:  # type: ignore[index]
            return None  # FallbackOutputError
    return input_model


def clean_needs_approval(flow: Flow, tools: Mapping[str, Tool]) -> bool:
    """Whether a run of a flow :func:`clean_input_model` showed clean asks for approval
    (what ``approval_request`` finds in its plan): the flow's own contract requires it
    (it covers every step), or a step's tool or fallback does."""
    own = flow.safety
    if own is not None and own.requires_approval:
        return True
    for step in flow.steps:
        for name in (step.tool_name, step.fallback):
            safety = tools[name].safety if name is not None else None
            if safety is not None and safety.requires_approval:
                return True
    return False


def _writes(step: FlowStep, tool: Tool, tools: Mapping[str, Tool],
            produced: frozenset[str]) -> frozenset[str] | None:
    """What a step with a fallback, a retry or an output mapping writes (None: not
    shown clean)."""
    if step.fallback is not None:
        fallback = tools.get(step.fallback)
        if fallback is None or fallback.output_schema is None:
            return None
        produced = produced | _fields(fallback.output_schema)[0]
    if step.retry is not None and (tool.safety is None or not tool.safety.idempotent):
        return None  # RetryNotAllowedError
    if step.output_mapping:
        if any(name not in produced for name in step.output_mapping.values()):
            return None  # UnknownFieldError
        produced = frozenset(step.output_mapping)
    return produced


def _fed(step: FlowStep, required: frozenset[str], available: set[str] | frozenset[str]
         ) -> bool:
    """Whether every mapped key and unmapped required field of a step is available."""
    mapping = step.input_mapping
    if not mapping:
        return required <= available
    return all(key in available for key in mapping.values()) and all(
        name in mapping or name in available for name in required)


def _chain_clean(steps: Sequence[FlowStep], facts: list[_Facts], input_keys: frozenset[str]
                 ) -> str | None:
    """Each step after the one before: what it reads is the input or written before."""
    available = set(input_keys)
    for step, (_, required, writes) in zip(steps, facts, strict=True):
        if not _fed(step, required, available):
            return None  # MissingContextKeyError
        available |= writes
    return "chain"


def _dag_clean(flow: Flow, facts: list[_Facts], input_keys: frozenset[str]) -> str | None:
    """Any DAG: what a step reads is the input or written by a step it runs after, and
    steps that may run at once write no key in common."""
    position_of = {index: position for position, index in enumerate(flow.order)}
    writes: list[frozenset[str]] = []
    ancestors: list[int] = []
    for position, index in enumerate(flow.order):
        _, required, written = facts[index]
        lineage = 0
        for dep in flow.dependencies[index]:
            lineage |= ancestors[position_of[dep]] | (1 << position_of[dep])
        available = input_keys.union(*(writes[p] for p in range(position)
                                       if lineage >> p & 1))
        if not _fed(flow.steps[index], required, available):
            return None  # MissingContextKeyError
        if any(not lineage >> p & 1 and writes[p] & written for p in range(position)):
            return None  # ConflictingWritesError
        writes.append(written)
        ancestors.append(lineage)
    return "dag"
