"""Reference-package flow content (``chainweaver`` 0.14 on PyPI) as ChainWeaver flow-file
content.

:func:`convert` takes one parsed reference flow (a ``Flow`` or a ``DAGFlow``, written by
hand or by its serializer) and returns the ChainWeaver flow-file mapping and a
:class:`Finding` for every field it cannot express: nothing is dropped silently. Fields at
their reference defaults need nothing. :class:`MigrationError` means the content is not a
reference flow at all. Reading, validating and writing files is
:mod:`chainweaver.cli.migrate`; docs/migrating.md describes both packages side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .conditions import Condition
from .errors import DefinitionError
from .mappings import Const, Pointer, source_data
from .retry import MAX_ATTEMPTS, MAX_BACKOFF_SECONDS

FORMAT_MAJOR = "1"  # the reference serializer's format_version
FLOW_KEYS = frozenset({
    "type", "format_version", "name", "version", "description", "steps", "deterministic",
    "status", "trigger_conditions", "input_schema_ref", "output_schema_ref",
    "context_schema_ref", "tool_schema_hashes", "capability_id", "governance", "safety",
    "on_context_collision", "dynamic_params"})
STEP_KEYS = frozenset({
    "tool_name", "flow_name", "input_mapping", "output_mapping", "retry", "on_error",
    "decision_candidates", "input_contract", "output_contract"})
DAG_STEP_KEYS = STEP_KEYS | {"step_id", "depends_on", "step_type", "capability_id",
                             "branches", "default_next"}
# Fields with no ChainWeaver counterpart, expressible only at these values.
FLOW_DEFAULTS: dict[str, Any] = {
    "deterministic": True, "status": "active", "trigger_conditions": None,
    "context_schema_ref": None, "tool_schema_hashes": None, "capability_id": None,
    "dynamic_params": []}
STEP_DEFAULTS: dict[str, Any] = {
    "decision_candidates": None, "input_contract": None, "output_contract": None,
    "step_type": "tool", "capability_id": None}
GOVERNANCE_DEFAULTS: dict[str, Any] = {
    "replaces_tools": [], "estimated_model_calls_removed": 0,
    "estimated_token_savings": None, "reviewed_by": None, "review_notes": None}
SAFETY_DEFAULTS: dict[str, Any] = {
    "stability": "stable", "determinism_level": "full", "cacheable": True,
    "safe_to_retry": True, "supports_dry_run": False}
LIFECYCLES = ("draft", "reviewed", "active", "archived")
WHY = {
    "deterministic": "ChainWeaver flows are always deterministic",
    "status": "ChainWeaver has no run status; the governance lifecycle decides what "
              "the MCP server publishes",
    "trigger_conditions": "no counterpart (metadata for an orchestrator)",
    "context_schema_ref": "no counterpart (the final context is not validated)",
    "tool_schema_hashes": "no counterpart (no drift detection)",
    "capability_id": "no counterpart (no Weaver Stack capabilities)",
    "dynamic_params": "no counterpart: every value a flow reads comes from its input or "
                      "its steps",
    "decision_candidates": "no counterpart: a step always runs its own tool",
    "input_contract": "no counterpart: the tool's own input model is what is checked",
    "output_contract": "no counterpart: the tool's own output model is what is checked",
    "step_type": "no counterpart: steps run local tools or flows",
}


class MigrationError(ValueError):
    """The content is not a reference-package flow; ``field`` says where (or None)."""

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Finding:
    """A field of the reference flow that the ChainWeaver flow does not express."""

    field: str
    message: str


def convert(data: Any) -> tuple[dict[str, Any], list[Finding]]:
    """The ChainWeaver flow-file content of one reference flow, and what it leaves out."""
    if not isinstance(data, dict):
        raise MigrationError(None, f"must be a mapping (a reference Flow or DAGFlow), got "
                             f"{type(data).__name__}")
    findings: list[Finding] = []
    note = findings.append
    kind = data.get("type")
    steps = data.get("steps")
    if kind is None:  # hand-written files may leave it out: DAG steps have ids
        kind = "DAGFlow" if isinstance(steps, list) and any(
            isinstance(s, dict) and "step_id" in s for s in steps) else "Flow"
    if kind not in ("Flow", "DAGFlow"):
        raise MigrationError("type", f"must be 'Flow' or 'DAGFlow', got {kind!r}")
    version = data.get("format_version")
    if version is not None and str(version).split(".")[0] != FORMAT_MAJOR:
        raise MigrationError("format_version", f"{version!r} is not a 0.14 reference "
                             f"format (major {FORMAT_MAJOR})")
    for key in ("name", "description"):
        if not isinstance(data.get(key), str):
            raise MigrationError(key, "missing, or not a string")
    if not isinstance(steps, list) or not steps:
        raise MigrationError("steps", "missing, or not a non-empty list")
    for key in sorted(set(data) - FLOW_KEYS):
        note(Finding(key, "not a field of the reference format; not converted"))
    _unsupported(data, "", FLOW_DEFAULTS, note)
    if data.get("on_context_collision", "warn") not in ("warn", "overwrite"):
        note(Finding("on_context_collision", "only 'overwrite' (and 'warn', without the "
                     "warning) is expressible: later steps' outputs overwrite earlier keys"))
    out: dict[str, Any] = {"name": data["name"], "version": data.get("version", "0.1.0"),
                           "description": data["description"]}
    governance = _governance(data.get("governance"), note)
    if governance:
        out["governance"] = governance
    safety = _safety(data.get("safety"), "safety", note)
    if safety:
        out["safety"] = safety
    for source, target in (("input_schema_ref", "input_schema"),
                           ("output_schema_ref", "output_schema")):
        if data.get(source) is not None:
            out[target] = data[source]
    dag = kind == "DAGFlow"
    out["steps"] = [_step(step, f"steps[{i}]", dag, note) for i, step in enumerate(steps)]
    if dag:
        _branches(steps, out["steps"], note)
    else:
        _linear_ids(out["steps"])
    return out, findings


def _unsupported(data: dict[str, Any], where: str, defaults: dict[str, Any],
                 note: Any) -> None:
    for key, default in defaults.items():
        if key in data and not _same(data[key], default):
            note(Finding(f"{where}{key}", WHY.get(key, "no counterpart")))


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, list):
        return list(value) == default
    return type(value) is type(default) and value == default


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise MigrationError(where, "must be a list of step ids")
    return list(value)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MigrationError(where, f"must be a mapping, got {type(value).__name__}")
    return value


def _governance(value: Any, note: Any) -> dict[str, Any]:
    data = _mapping(value, "governance")
    out: dict[str, Any] = {}
    lifecycle = data.get("lifecycle", "active")
    if lifecycle in LIFECYCLES:
        if lifecycle != "active":
            out["lifecycle"] = lifecycle
    else:
        note(Finding("governance.lifecycle", f"{lifecycle!r} has no counterpart (lifecycles:"
                     f" {', '.join(LIFECYCLES)}); the flow is written as 'draft'"))
        out["lifecycle"] = "draft"  # never published until someone reviews it
    if data.get("owner") is not None:
        out["owner"] = data["owner"]
    _unsupported(data, "governance.", GOVERNANCE_DEFAULTS, note)
    return out


def _safety(value: Any, where: str, note: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    data = dict(_mapping(value, where))
    if "requires_review" in data:  # the reference's older name
        data.setdefault("requires_approval", data.pop("requires_review"))
    side_effects = data.get("side_effects", "none")
    out: dict[str, Any] = {"side_effects": side_effects,
                           "idempotent": data.get("idempotent", True)}
    for key in ("requires_approval", "approval_reason"):
        if data.get(key) not in (None, False):
            out[key] = data[key]
    read_only = side_effects in ("none", "read")
    if data.get("read_only", read_only) != read_only:
        note(Finding(f"{where}.read_only", f"no counterpart: it follows from "
                     f"side_effects ({side_effects!r})"))
    _unsupported(data, f"{where}.", SAFETY_DEFAULTS, note)
    return out


def _step(step: Any, where: str, dag: bool, note: Any) -> dict[str, Any]:
    if not isinstance(step, dict):
        raise MigrationError(where, f"must be a mapping, got {type(step).__name__}")
    for key in sorted(set(step) - (DAG_STEP_KEYS if dag else STEP_KEYS)):
        note(Finding(f"{where}.{key}", "not a field of the reference format"
                     f"{'' if dag else ' for Flow steps'}; not converted"))
    out: dict[str, Any] = {}
    if dag:
        if not isinstance(step.get("step_id"), str):
            raise MigrationError(f"{where}.step_id", "missing, or not a string")
        out["id"] = step["step_id"]
    tool, flow = step.get("tool_name"), step.get("flow_name")
    if (tool is None) == (flow is None) or not isinstance(tool or flow, str):
        raise MigrationError(where, "needs exactly one of tool_name and flow_name (a "
                             "string)")
    if tool is not None:
        out["tool"] = tool
    else:
        out["flow"] = flow
    if dag:
        out["after"] = _strings(step.get("depends_on"), f"{where}.depends_on")
    _unsupported(step, f"{where}.", STEP_DEFAULTS, note)
    mapping = _mapping(step.get("input_mapping"), f"{where}.input_mapping")
    sources = {field: _source(value, f"{where}.input_mapping.{field}", note)
               for field, value in mapping.items()}
    if sources:
        out["input_mapping"] = {k: v for k, v in sources.items() if v is not None}
    outputs = _mapping(step.get("output_mapping"), f"{where}.output_mapping")
    if outputs:
        out["output_mapping"] = dict(outputs)
    if step.get("retry") is not None:
        out["retry"] = _retry(step["retry"], f"{where}.retry", note)
    on_error = step.get("on_error", "fail")
    if isinstance(on_error, str) and on_error.startswith("fallback:"):
        out["on_error"], out["fallback"] = "fallback", on_error[len("fallback:"):]
    elif on_error != "fail":
        out["on_error"] = on_error  # "skip"; anything else the loader reports
    return out


def _source(value: Any, where: str, note: Any) -> Any:
    """A reference mapping value: a context key, a JSON pointer, or a constant (None:
    not expressible, and left out)."""
    if isinstance(value, str) and not value.startswith("/"):
        return value
    try:
        return source_data(Pointer(value) if isinstance(value, str) else Const(value))
    except DefinitionError as error:
        note(Finding(where, f"{error}; not converted"))
        return None


def _retry(value: Any, where: str, note: Any) -> dict[str, Any]:
    data = _mapping(value, where)
    retries = data.get("max_retries", 3)
    backoff = data.get("backoff_seconds", 1.0)
    multiplier = data.get("backoff_multiplier", 2.0)
    numbers = (retries, backoff, multiplier)
    if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n)
               for n in numbers):
        raise MigrationError(where, "max_retries, backoff_seconds and backoff_multiplier "
                             "must be finite numbers")
    out: dict[str, Any] = {"max_attempts": min(int(retries) + 1, MAX_ATTEMPTS),
                           "backoff_seconds": backoff}
    if retries + 1 > MAX_ATTEMPTS:
        note(Finding(f"{where}.max_retries", f"{retries} retries: at most "
                     f"{MAX_ATTEMPTS - 1} are expressible (written as {MAX_ATTEMPTS - 1})"))
    if retries > 1 and multiplier != 2:
        note(Finding(f"{where}.backoff_multiplier", f"{multiplier}: waits double after each "
                     "failure in ChainWeaver (written as 2)"))
    longest = backoff * 2.0 ** max(min(retries, MAX_ATTEMPTS) - 1, 0)
    if longest > MAX_BACKOFF_SECONDS or backoff > MAX_BACKOFF_SECONDS:
        note(Finding(f"{where}.backoff_seconds", f"waits of up to {longest:g} s: at most "
                     f"{MAX_BACKOFF_SECONDS} s are expressible (waits capped there)"))
    # The reference never caps a wait: the cap is its longest one.
    out["max_backoff_seconds"] = min(longest, MAX_BACKOFF_SECONDS)
    out["backoff_seconds"] = min(backoff, MAX_BACKOFF_SECONDS)
    if data.get("jitter"):
        out["jitter"] = 0.5  # each wait times [0.5, 1.5), as in the reference
    errors = data.get("retryable_errors", ["builtins:Exception"])
    if not isinstance(errors, (list, tuple)) or not all(isinstance(e, str) for e in errors):
        raise MigrationError(f"{where}.retryable_errors", "must be a list of strings")
    out["retry_on"] = [e[len("builtins:"):] if e.startswith("builtins:") else e
                       for e in errors]
    return out


def _linear_ids(steps: list[dict[str, Any]]) -> None:
    """A tool used by several steps of a linear flow needs an id on each (name_2...)."""
    names = [step.get("tool") or step.get("flow") for step in steps]
    taken = set(names)
    for index, name in enumerate(names):
        if names.count(name) == 1:
            continue
        step_id = name
        if names.index(name) != index:
            number = 2
            while f"{name}_{number}" in taken:
                number += 1
            step_id = f"{name}_{number}"
            taken.add(step_id)
        steps[index] = {"id": step_id, **steps[index]}


# ------------------------------------------------------------------ branches


def _par(text: str) -> str:
    return text if text.isidentifier() or text.startswith("not (") and text.endswith(")") \
        and text.count("(") == 1 else f"({text})"


def _either(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else " or ".join(_par(p) for p in parts)


def _both(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else " and ".join(_par(p) for p in parts)


def _neither(parts: list[str]) -> str:
    return f"not ({_either(parts)})"


def _branch_conditions(step: dict[str, Any], where: str, dependents: list[str],
                       note: Any) -> dict[str, str | None] | None:
    """Per dependent of a branching step: when the reference runs it (None: always),
    or None when the branches are not expressible."""
    edges = step.get("branches")
    if not isinstance(edges, list):
        raise MigrationError(f"{where}.branches", "must be a list of edges")
    predicates: list[str] = []
    targets: list[str] = []
    ok = True
    for index, edge in enumerate(edges):
        here = f"{where}.branches[{index}]"
        if not isinstance(edge, dict) or not isinstance(edge.get("predicate"), str) \
                or not isinstance(edge.get("target_step_id"), str):
            raise MigrationError(here, "needs target_step_id and predicate strings")
        try:
            Condition(edge["predicate"])
        except DefinitionError as error:
            note(Finding(f"{here}.predicate", f"{error}; the branch is not converted"))
            ok = False
        predicates.append(edge["predicate"].strip())
        targets.append(edge["target_step_id"])
    if not ok:
        return None
    default = step.get("default_next")
    if default is not None and not isinstance(default, str):
        raise MigrationError(f"{where}.default_next", "must be a step id")
    result: dict[str, str | None] = {}
    for dependent in dependents:
        # The first edge whose predicate holds picks its target; when none holds the
        # default runs, or, without one, every dependent.
        hits = [i for i, target in enumerate(targets) if target == dependent]
        if default is None and len(hits) == 1:
            i = hits[0]  # picked, or nothing picked: no earlier edge holds, and this one
            parts = [_neither(predicates[:i])] if i else []  # or no later one does
            if predicates[i + 1:]:
                parts.append(_either([predicates[i], _neither(predicates[i + 1:])]))
            result[dependent] = _both(parts) if parts else None
            continue
        terms = [_both([predicates[i], _neither(predicates[:i])]) if i else predicates[i]
                 for i in hits]
        if default is None or default == dependent:
            terms.append(_neither(predicates))
        result[dependent] = _either(terms) if terms else "False"
    return result


def _branches(steps: list[dict[str, Any]], out: list[dict[str, Any]], note: Any) -> None:
    """Branches become ``when`` conditions; so does the reference's skip propagation (a
    step whose every predecessor was skipped is skipped too)."""
    ids = [step["id"] for step in out]
    if len(set(ids)) != len(ids):
        return  # the loader reports duplicate ids
    by_id = dict(zip(ids, out, strict=True))
    order = _order(out, by_id)
    if order is None:
        return  # the loader reports unknown ids and cycles
    branching: dict[str, dict[str, str | None]] = {}
    for index, (step, converted) in enumerate(zip(steps, out, strict=True)):
        if not step.get("branches"):
            if step.get("default_next") is not None:
                note(Finding(f"steps[{index}].default_next", "ignored without branches "
                             "(as in the reference); not converted"))
            continue
        dependents = [c["id"] for c in out if converted["id"] in c["after"]]
        conditions = _branch_conditions(step, f"steps[{index}]", dependents, note)
        if conditions is not None:
            branching[converted["id"]] = conditions
    active: dict[str, str | None] = {}
    for step_id in order:
        after = by_id[step_id]["after"]
        parts = []
        for parent in after:
            chosen = branching.get(parent, {}).get(step_id)
            if chosen is not None:
                # A skipped branching step picks nothing: its dependents then run.
                parent_on = active[parent]
                parts.append(chosen if parent_on is None
                             else _either([_neither([parent_on]), chosen]))
        parents_on = [active[p] for p in after]
        if after and all(on is not None for on in parents_on):
            parts.append(_either([on for on in parents_on if on is not None]))
        active[step_id] = _both(parts) if parts else None
    for index, converted in enumerate(out):
        condition = active[converted["id"]]
        if condition is None:
            continue
        try:
            Condition(condition)
        except DefinitionError as error:
            note(Finding(f"steps[{index}]", f"its branch condition is not expressible: "
                         f"{error}"))
            continue
        converted["when"] = condition


def _order(out: list[dict[str, Any]], by_id: dict[str, dict[str, Any]]) -> list[str] | None:
    """Step ids, each after the steps it waits for (None: an unknown id or a cycle)."""
    order: list[str] = []
    done: set[str] = set()
    pending = [c["id"] for c in out]
    while pending:
        ready = [i for i in pending if all(a in done for a in by_id[i]["after"])]
        if not ready:
            return None
        order.extend(ready)
        done.update(ready)
        pending = [i for i in pending if i not in done]
    return order
