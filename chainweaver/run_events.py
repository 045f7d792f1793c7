"""Talking to a run while it runs: an observer of its steps, a cancellation, an approval.

All three are optional keywords of :meth:`FlowExecutor.execute_flow` and
:meth:`FlowExecutor.execute_flow_async`; a run without them takes exactly the path it
always took, except that a flow with a step that needs approval does not run at all
without ``approve=`` (a hook, or :data:`ALWAYS_APPROVE`). :func:`approval_request`
says which steps one approval covers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .safety import ToolSafetyContract

if TYPE_CHECKING:
    from .plan import Plan
    from .results import ErrorInfo, ExecutionResult, StepRecord

logger = logging.getLogger("chainweaver.executor")

T = TypeVar("T")


class RunObserver:
    """Told about a run as it goes; override the methods you need (each does nothing).

    Only the run's own steps are reported (a sub-flow step is one step). A method
    may be called from a worker thread (sync tools in the async lane run there), so
    keep it quick and thread-safe. Records are the run's own: read, never change
    them. An exception raised by a method is logged and ignored.
    """

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        """The input is valid (and approved): ``total_steps`` steps are planned."""

    def step_started(self, record: StepRecord) -> None:
        """A step starts (``record.status`` is ``"running"``)."""

    def step_retrying(self, record: StepRecord, error: ErrorInfo) -> None:
        """An attempt of a step failed with ``error`` and the step will try again."""

    def step_finished(self, record: StepRecord) -> None:
        """A step ended: ``completed``, ``skipped``, ``failed`` or ``cancelled``."""

    def run_finished(self, result: ExecutionResult) -> None:
        """The run is over (not called when the task running it was cancelled)."""


def notify(method: Callable[..., None], *arguments: Any) -> None:
    """Call an observer method; a broken observer never breaks the run."""
    try:
        method(*arguments)
    except Exception:
        logger.warning("run observer %s raised", getattr(method, "__qualname__", method),
                       exc_info=True)


def fan_out(*observers: RunObserver | None) -> RunObserver | None:
    """One observer telling each of ``observers`` (None ones left out) in turn; a broken
    one never keeps the others from being told."""
    present = tuple(observer for observer in observers if observer is not None)
    if len(present) <= 1:
        return present[0] if present else None
    return _FanOut(present)


class _FanOut(RunObserver):
    def __init__(self, observers: tuple[RunObserver, ...]) -> None:
        self.observers = observers

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        for observer in self.observers:
            notify(observer.run_started, flow_name, flow_version, total_steps)

    def step_started(self, record: StepRecord) -> None:
        for observer in self.observers:
            notify(observer.step_started, record)

    def step_retrying(self, record: StepRecord, error: ErrorInfo) -> None:
        for observer in self.observers:
            notify(observer.step_retrying, record, error)

    def step_finished(self, record: StepRecord) -> None:
        for observer in self.observers:
            notify(observer.step_finished, record)

    def run_finished(self, result: ExecutionResult) -> None:
        for observer in self.observers:
            notify(observer.run_finished, result)


class RunCancelled(Exception):
    """Internal: the run's :class:`Cancellation` was set."""


class Cancellation:
    """Stops a run at the next step boundary when :meth:`cancel` is called (any thread).

    In the async lane, async tools that are running are cancelled at once; a sync
    tool already running in a worker thread finishes and its output is discarded.
    No later step, retry or fallback starts. The run's result then fails with
    ``CancelledError``; steps that were running are recorded as ``cancelled``.
    """

    __slots__ = ("_event", "_callbacks", "_lock")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    async def guard(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine``; raise :class:`RunCancelled` if cancelled meanwhile."""
        task = asyncio.ensure_future(coroutine)
        loop = asyncio.get_running_loop()

        def stop() -> None:
            loop.call_soon_threadsafe(task.cancel)

        with self._lock:
            if self._event.is_set():
                task.cancel()
            else:
                self._callbacks.append(stop)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and self._event.is_set() \
                    and not (current is not None and current.cancelling()):
                raise RunCancelled from None
            raise  # the task awaiting the run was cancelled
        finally:
            with self._lock:
                if stop in self._callbacks:
                    self._callbacks.remove(stop)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


@dataclass(frozen=True)
class CoveredStep:
    """One step an approval covers.

    ``step_id`` is the step's id, or its path through sub-flow steps
    (``"cleanup/delete"``: step ``delete`` of the sub-flow that step ``cleanup`` runs).
    ``tool_name`` is the tool it runs (with ``fallback`` true: the fallback tool, which
    runs only when the step's own tool fails). ``side_effects`` is that tool's
    side-effect level, ``reason`` the approval reason that applies: the tool's own when
    its contract requires approval, else that of the flow whose own contract does.
    ``step_index`` is the index of the top-level step it belongs to.
    """

    step_id: str
    tool_name: str
    side_effects: str
    reason: str | None
    step_index: int
    fallback: bool = False


@dataclass(frozen=True)
class ApprovalRequest:
    """What one approval of a run covers: every step of it that requires approval.

    A run asks once, after its input is valid and before any step starts. The approval
    covers exactly the steps (in plan order, sub-flow steps where their sub-flow step
    runs) whose tool or fallback tool has a safety contract with ``requires_approval``,
    and every step of a flow (the run's own, or a sub-flow at any depth) whose own
    contract (``Flow(safety=...)``) requires it; no other step. ``steps`` is never empty.

    ``step_id``, ``step_index``, ``tool_name``, ``side_effects`` and ``reason`` are
    those of the first covered step (what a request held before it listed them all).

    A run with a caller whose flow declares step grants (or has a step authorizer)
    also says what the approval is asked under (:mod:`chainweaver.engine.approved`):
    ``caller_id``, and ``grants``, one ``(path, kind, basis)`` per grant check on the
    way to a covered step (``basis``: ``"caller"``, ``"delegation"``,
    ``"authorizer"``, ``"open"`` or ``"refused"``). ``changed`` is set when the
    approval is asked *again* because the decision at that step path (or the
    caller) changed after the run was approved; ``steps`` then lists the covered
    steps that have not run yet.
    """

    flow_name: str
    flow_version: str
    steps: tuple[CoveredStep, ...]
    grants: tuple[tuple[str, str, str], ...] = ()
    caller_id: str | None = None
    changed: str | None = None

    @property
    def step_ids(self) -> tuple[str, ...]:
        """The ids (paths) of the covered steps, in plan order (a step whose tool and
        fallback both need approval appears twice)."""
        return tuple(step.step_id for step in self.steps)

    @property
    def fingerprint(self) -> str:
        """A SHA-256 (hex) of the flow, its version and everything listed about every
        covered step: an answer bound to it approves exactly this question."""
        question: list[Any] = [self.flow_name, self.flow_version,
                               [dataclasses.astuple(step) for step in self.steps]]
        if self.grants or self.caller_id is not None or self.changed is not None:
            # Asked under step grants: the decisions it was asked under are part of it.
            question += [[list(check) for check in self.grants], self.caller_id,
                         self.changed]
        body = json.dumps(question, separators=(",", ":"))
        return hashlib.sha256(body.encode("utf-8")).hexdigest()

    @property
    def step_id(self) -> str:
        return self.steps[0].step_id

    @property
    def step_index(self) -> int:
        return self.steps[0].step_index

    @property
    def tool_name(self) -> str:
        return self.steps[0].tool_name

    @property
    def side_effects(self) -> str:
        return self.steps[0].side_effects

    @property
    def reason(self) -> str | None:
        return self.steps[0].reason

    def describe(self) -> str:
        """The covered steps in one line: ``step 'delete' (tool 'erase', write: why)``."""
        return "; ".join(describe_step(step) for step in self.steps)


def describe_step(step: CoveredStep) -> str:
    """``step 'delete' (tool 'erase', write: deletes the account)``."""
    what = f"fallback tool {step.tool_name!r}" if step.fallback else f"tool {step.tool_name!r}"
    why = step.reason if step.reason else "no reason given"
    return f"step {step.step_id!r} ({what}, {step.side_effects}: {why})"


class _AlwaysApprove:
    """The type of :data:`ALWAYS_APPROVE` (one instance)."""

    __slots__ = ()

    def __call__(self, request: ApprovalRequest) -> bool:
        return True

    def __repr__(self) -> str:
        return "ALWAYS_APPROVE"

    def __reduce__(self) -> str:
        return "ALWAYS_APPROVE"


ALWAYS_APPROVE: Final = _AlwaysApprove()
"""``approve=ALWAYS_APPROVE``: run a flow whose steps need approval without asking anyone.

The deliberate opt-out for library callers (tests, batch jobs, a caller that asked its
user already): without ``approve=`` a flow that needs approval does not run."""

# What ``approve=`` takes: a hook returning ``True`` to approve (sync, or async: a
# returned awaitable is awaited), or ALWAYS_APPROVE.
ApprovalHook = Callable[[ApprovalRequest], bool | Awaitable[bool]]
Approver = Callable[[ApprovalRequest], Awaitable[bool]]  # an async hook


def approval_request(plan: Plan) -> ApprovalRequest | None:
    """What one approval of a run of ``plan`` covers (None: no step needs approval).

    Computed once per plan (a plan, its sub-plans included, never changes)."""
    if plan.approval is None:
        steps = tuple(_covered(plan, "", None, None))
        plan.approval = (ApprovalRequest(plan.flow.name, plan.flow.version, steps)
                         if steps else None,)
    request: ApprovalRequest | None = plan.approval[0]
    return request


def _covered(plan: Plan, prefix: str, index: int | None,
             enclosing: ToolSafetyContract | None) -> Iterator[CoveredStep]:
    """The covered steps of ``plan``, a sub-flow's when ``prefix`` is its step's path;
    ``enclosing``: the contract of the nearest enclosing flow that requires approval."""
    own = plan.flow.safety
    flow_contract = own if own is not None and own.requires_approval else enclosing
    for planned in plan.steps:
        path = prefix + planned.id
        top = planned.index if index is None else index
        if planned.subplan is not None:
            yield from _covered(planned.subplan, path + "/", top, flow_contract)
        for tool, fallback in ((planned.tool, False), (planned.fallback, True)):
            if tool is None:
                continue
            contract = tool.safety
            required = contract if contract is not None and contract.requires_approval \
                else flow_contract
            if required is None:
                continue
            level = (contract or required).side_effects.value
            yield CoveredStep(path, tool.name, level, required.approval_reason, top, fallback)


async def ask_approval(approve: ApprovalHook, request: ApprovalRequest) -> str | None:
    """Why the run may not go on (None: approved). Only an explicit ``True`` approves."""
    try:
        answer = approve(request)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as error:
        return hook_raised(error)
    return approval_verdict(answer)


def approval_verdict(answer: object) -> str | None:
    """Why a hook's answer does not approve (None: it is ``True``)."""
    return None if answer is True else "it was not approved"


def hook_raised(error: Exception) -> str:
    """Why the run may not go on when the hook raised ``error`` (logged)."""
    logger.warning("approval hook raised %s", type(error).__name__, exc_info=True)
    return f"the approval hook raised {type(error).__name__}"
