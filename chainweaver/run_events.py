"""Talking to a run while it runs: an observer of its steps, a cancellation, an approval.

All three are optional keywords of :meth:`FlowExecutor.execute_flow_async` (the
observer and the cancellation of :meth:`FlowExecutor.execute_flow` too); a run
without them takes exactly the path it always took.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .safety import ToolSafetyContract

if TYPE_CHECKING:
    from .plan import Plan, PlannedStep
    from .runner import ErrorInfo, ExecutionResult, StepRecord

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
            # Task.cancelling() is Python 3.11+: on 3.10 a cancellation of the task
            # awaiting the run while this is set reads as this one.
            cancelling = getattr(asyncio.current_task(), "cancelling", None)
            if task.cancelled() and self._event.is_set() \
                    and not (cancelling is not None and cancelling()):
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
class ApprovalRequest:
    """What a run asks approval for: the first step (in plan order) whose tool, fallback
    or sub-flow requires approval (the first step, when the flow's own contract does)."""

    flow_name: str
    flow_version: str
    step_id: str
    step_index: int
    tool_name: str
    side_effects: str
    reason: str | None


Approver = Callable[[ApprovalRequest], Awaitable[bool]]


def approval_request(plan: Plan) -> ApprovalRequest | None:
    """What a run of ``plan`` must ask approval for, if anything."""
    flow = plan.flow
    if not plan.steps:
        return None
    if flow.safety is not None and flow.safety.requires_approval:
        return _request(plan, plan.steps[0], flow.safety)
    for planned in plan.steps:
        contract = _step_approval(planned)
        if contract is not None:
            return _request(plan, planned, contract)
    return None


def _step_approval(planned: PlannedStep) -> ToolSafetyContract | None:
    for tool in (planned.tool, planned.fallback):
        if tool is not None and tool.safety is not None and tool.safety.requires_approval:
            return tool.safety
    if planned.subplan is not None:
        sub = planned.subplan
        if sub.flow.safety is not None and sub.flow.safety.requires_approval:
            return sub.flow.safety
        for inner in sub.steps:
            contract = _step_approval(inner)
            if contract is not None:
                return contract
    return None


def _request(plan: Plan, planned: PlannedStep, contract: ToolSafetyContract
             ) -> ApprovalRequest:
    return ApprovalRequest(plan.flow.name, plan.flow.version, planned.id, planned.index,
                           planned.step.name, contract.side_effects.value,
                           contract.approval_reason)


async def ask_approval(approve: Approver, request: ApprovalRequest) -> str | None:
    """Why the run may not go on (None: approved). Only an explicit ``True`` approves."""
    try:
        answer = await approve(request)
    except Exception as error:
        logger.warning("approval hook raised %s", type(error).__name__, exc_info=True)
        return f"the approval hook raised {type(error).__name__}"
    return None if answer is True else "it was not approved"
