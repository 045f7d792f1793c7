"""How a run's steps are named to one caller: in the tool result's ``_meta`` and in
the spans telemetry opens for them.

A caller that cannot see a sub-flow (not published, or outside its view) sees the step
running it as one step, ``subflow#<index>``, with nothing inside it named.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from chainweaver.executor import ExecutionResult, StepRecord
from chainweaver.mcp.gate.views import View
from chainweaver.mcp.publish.exposure import ExposedFlow, Exposure
from chainweaver.plan import Plan
from chainweaver.run_events import ApprovalRequest

HIDDEN_STEP = "subflow#{index}"  # how a sub-flow step the caller cannot see is named


class StepNames:
    """How a run's steps are named to one caller.

    A sub-flow step whose sub-flow the caller cannot see (not published, or outside
    its view) is named ``subflow#<index>`` (its position in its flow's steps), and
    nothing inside it is named: not its id (by default the sub-flow's name), not its
    steps. Every other step keeps its id.
    """

    __slots__ = ("_hidden", "_inner", "_flows")

    def __init__(self, plan: Plan | None, visible: Callable[[str], bool]) -> None:
        self._hidden: dict[str, str] = {}  # step id -> the label shown instead
        self._inner: dict[str, StepNames] = {}  # a visible sub-flow step's own names
        self._flows: dict[str, tuple[str, int]] = {}  # its sub-flow and its index
        for planned in plan.steps if plan is not None else ():
            if planned.subplan is None:
                continue
            if visible(planned.subplan.flow.name):
                self._inner[planned.id] = StepNames(planned.subplan, visible)
                self._flows[planned.id] = (planned.subplan.flow.name, planned.index)
            else:
                self._hidden[planned.id] = HIDDEN_STEP.format(index=planned.index)

    def label(self, step_id: str) -> str:
        """What a step of this flow (not a path) is called."""
        return self._hidden.get(step_id, step_id)

    def hides(self, step_id: str) -> bool:
        """Whether ``step_id`` runs a sub-flow the caller cannot see."""
        return step_id in self._hidden

    def hides_any(self) -> bool:
        """Whether any step, at any depth, runs a sub-flow the caller cannot see."""
        return bool(self._hidden) or any(inner.hides_any() for inner in self._inner.values())

    def inner(self, step_id: str) -> StepNames | None:
        """The names inside a visible sub-flow step (None: not one)."""
        return self._inner.get(step_id)

    def hidden_paths(self) -> dict[str, str]:
        """Every step path, at any depth, that runs a sub-flow the caller cannot see ->
        the label it shows instead."""
        paths = dict(self._hidden)
        for step_id, inner in self._inner.items():
            for path, label in inner.hidden_paths().items():
                paths[f"{step_id}/{path}"] = label
        return paths

    def named_subflows(self) -> dict[str, list[Any]]:
        """Every sub-flow step named to this caller, at any depth: its path -> [its
        sub-flow, its index]. A run record keeps it, so that a reader who cannot see
        that sub-flow any more reads the step as ``subflow#<index>`` (:func:`masked`)."""
        named: dict[str, list[Any]] = {}
        for step_id, (flow, index) in self._flows.items():
            named[step_id] = [flow, index]
            for path, entry in self._inner[step_id].named_subflows().items():
                named[f"{step_id}/{path}"] = entry
        return named

    def path(self, path: str) -> str:
        """A step path (``"outer/inner"``: step ``inner`` of the sub-flow step ``outer``)
        as the caller may see it: cut at the first sub-flow it cannot see."""
        if path in self._hidden or path in self._inner:
            return self.label(path)
        for step_id, label in self._hidden.items():
            if path.startswith(step_id + "/"):
                return label
        for step_id, names in self._inner.items():
            if path.startswith(step_id + "/"):
                return f"{step_id}/{names.path(path[len(step_id) + 1:])}"
        return path

    def shown(self, request: ApprovalRequest) -> ApprovalRequest:
        """``request`` as the caller's user may see it (the approval question)."""
        steps = getattr(request, "steps", None)
        if not (self.hides_any() and isinstance(steps, tuple)):
            return request
        changed = getattr(request, "changed", None)
        return dataclasses.replace(request, steps=tuple(
            dataclasses.replace(step, step_id=self.path(step.step_id)) for step in steps),
            changed=self.path(changed) if changed is not None else None)


ALL_VISIBLE = StepNames(None, lambda name: True)


def masked(document: dict[str, Any], subflows: dict[str, list[Any]],
           visible: Callable[[str], bool]) -> dict[str, Any]:
    """A run record's ``document`` as a reader sees it now: each sub-flow step it was
    recorded naming (``subflows``, from :meth:`StepNames.named_subflows`) whose sub-flow
    the reader cannot see (``visible``: by flow name) is ``subflow#<index>`` with
    nothing nested, in its steps, its failed step's path and its approvals' paths."""
    hidden = {path: HIDDEN_STEP.format(index=index)
              for path, (flow, index) in subflows.items() if not visible(flow)}
    if not hidden:
        return document
    document["steps"] = _masked_steps(document["steps"], "", hidden)
    if document.get("error_step") is not None:
        document["error_step"] = _masked_path(document["error_step"], hidden)
    document["approvals"] = [
        {**approval, "steps": [_masked_path(path, hidden) for path in approval["steps"]]}
        if isinstance(approval.get("steps"), list) else approval
        for approval in document["approvals"]]
    return document


def relabelled(entries: list[Any], names: StepNames) -> list[Any]:
    """Step entries (``_meta.chainweaver.steps`` as sent when a run ended) named as
    ``names`` names them now: a stored background task's result is read long after its
    run, and a sub-flow it named may have left its caller's view since."""
    return _masked_steps(entries, "", names.hidden_paths())


def _masked_steps(entries: list[Any], prefix: str, hidden: dict[str, str]) -> list[Any]:
    shown = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            shown.append(entry)
            continue
        path = f"{prefix}{entry['id']}"
        if path in hidden:
            entry = {key: value for key, value in entry.items() if key != "steps"}
            entry["id"] = hidden[path]
        elif isinstance(entry.get("steps"), list):
            entry = {**entry, "steps": _masked_steps(entry["steps"], path + "/", hidden)}
        shown.append(entry)
    return shown


def _masked_path(path: Any, hidden: dict[str, str]) -> Any:
    """``path`` cut at its first hidden sub-flow step (as :meth:`StepNames.path`)."""
    if not isinstance(path, str):
        return path
    parts = path.split("/")
    for end in range(1, len(parts) + 1):
        label = hidden.get("/".join(parts[:end]))
        if label is not None:
            return "/".join([*parts[:end - 1], label])
    return path


def run_meta(result: ExecutionResult, error_detail: str = "full",
             names: StepNames = ALL_VISIBLE) -> dict[str, Any]:
    """The tool result's ``_meta``: which flow version ran and, per step, its id, status,
    attempts and duration (a sub-flow's steps nested under ``steps``); the error type of
    a failed or skipped step too, never its text, and not even the type when
    ``error_detail`` is ``"generic"``. Steps are named as ``names`` says: a sub-flow the
    caller cannot see is one step, ``subflow#<index>``, with no steps nested.

    A run with too many steps to describe within :data:`STEPS_BUDGET` (hundreds) says
    how many it had (``steps_omitted``) instead: with the output, the result must fit
    one message (see :mod:`chainweaver.mcp.gate.body_cap`)."""
    steps = _step_meta(result.steps, error_detail, names)
    meta: dict[str, Any] = {"flow": result.flow_name, "version": result.flow_version}
    if _bound(steps) > STEPS_BUDGET and len(json.dumps(steps)) > STEPS_BUDGET:
        meta["steps_omitted"] = len(steps)
    else:
        meta["steps"] = steps
    return {"chainweaver": meta}


# At most this much of a result's message (as sent) describes its steps: the rest of
# what one message carries, beside the output's MESSAGE_BUDGET, is the envelope's.
STEPS_BUDGET = 16 * 1024


def _bound(steps: list[dict[str, Any]]) -> int:
    """No fewer than the bytes ``steps`` take as JSON, escaped as any transport sends
    them (an entry's keys, status and numbers take under 192): cheap, so that only a
    run with very many steps, or very long step ids, is measured."""
    size = 2 + 192 * len(steps)
    for entry in steps:
        size += 12 * (len(entry["id"]) + len(entry.get("error", ""))
                      + len(entry.get("fallback", "")))
        nested = entry.get("steps")
        if nested:
            size += _bound(nested)
    return size


def step_names(view: View, snapshot: Exposure, exposed: ExposedFlow) -> StepNames:
    """How ``exposed``'s steps are named in ``view`` (of ``snapshot``), worked out once
    per view."""
    return view.cached(f"steps:{exposed.flow.name} {exposed.flow.version}",
                       lambda: StepNames(exposed.plan,
                                         lambda name: view.allows(snapshot.flow(name))))


def _step_meta(records: list[StepRecord], error_detail: str,
               names: StepNames) -> list[dict[str, Any]]:
    return [step_entry(record, error_detail, names) for record in records]


def step_entry(record: StepRecord, error_detail: str, names: StepNames) -> dict[str, Any]:
    """One step as the caller may see it: id, status, attempts, timing, the error type
    (unless ``error_detail`` is ``"generic"``), the fallback and a visible sub-flow's
    own steps."""
    entry: dict[str, Any] = {"id": names.label(record.step_id), "status": record.status,
                             "attempts": record.attempts,
                             "started_ms": round(record.started_ms, 3),
                             "duration_ms": round(record.duration_ms, 3)}
    if record.error is not None and error_detail != "generic":
        entry["error"] = record.error.type
    if record.fallback is not None:
        entry["fallback"] = record.fallback
    if record.steps is not None and not names.hides(record.step_id):
        entry["steps"] = _step_meta(record.steps, error_detail,
                                    names.inner(record.step_id) or ALL_VISIBLE)
    return entry
