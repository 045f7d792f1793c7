"""A run's approval: whether it is asked before the first step, what it covers of the
run's step grants, and asking again when that changes.

Before its first step a run of a plan that has steps needing approval asks its
approval hook once (:func:`approval_gate`): refused at once without a hook, not asked
with :data:`~chainweaver.run_events.ALWAYS_APPROVE` or for a sub-flow (its parent run
asked: :data:`PARENT_DECIDED`).

A run's approval is asked once, before its first step, under the step-grant decisions
of that moment: who the caller is and, for every grant check on the way to a step the
approval covers (the step itself or its fallback, and each sub-flow step around it),
what allows it then (its *basis*): the caller's own grants (``"caller"``), a delegation
the flow declares (``"delegation"``: the caller lacks the grant), the step authorizer
alone (``"authorizer"``: nothing declared), nothing at all (``"open"``), or nothing
(``"refused"``: the caller could not run it then).

Before each attempt of such a check the run compares the decision *now* with the one
approved. A refusal stops the run as it always does. A step that is still allowed, but
on another basis or for another caller (the caller lost the grant and a delegation now
covers it, say), is no longer what was approved: the run asks its approval hook again,
for the covered steps that have not run yet, and the step runs only if that approves
(else the run stops there with ``ApprovalDenied``, before the step's effect).

Only a run with a guard (declared grants or a step authorizer) *and* an approval hook
that was asked keeps an :class:`ApprovedGrants`; no other run compares anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from ..grants import StepRequest
from ..plan import GrantNeed, Plan
from ..results import ErrorInfo
from ..run_events import (
    ALWAYS_APPROVE,
    ApprovalHook,
    ApprovalRequest,
    CoveredStep,
    approval_request,
    approval_verdict,
    ask_approval,
    hook_raised,
)
from ..step_guard import StepGuard, _blocking
from .calling import run_coroutine_blocking

logger = logging.getLogger("chainweaver.executor")

T = TypeVar("T")

# The refusal reason of a step whose approval was asked again and not given.
RENEWAL_DENIED = "approval_not_renewed"
Key = tuple[str, str]  # (step path, kind of check)
_WORDS = {"caller": "the caller's own grants", "delegation": "the flow's delegation",
          "authorizer": "the step authorizer", "open": "no declared grant",
          "refused": "nothing (it would have been refused)"}


def basis(requires: Any, delegated: str | None, caller: Any, authorizer: bool) -> str:
    """What allows a check for ``caller``: see the module's docstring."""
    if caller is None:
        return "refused"
    if requires is None:
        return "authorizer" if authorizer else "open"
    if requires.held_by(caller):
        return "caller"
    return "delegation" if delegated is not None else "refused"


def caller_id(caller: Any) -> str | None:
    value = getattr(caller, "id", None)
    return value if isinstance(value, str) else None


def own_key(step: CoveredStep) -> Key:
    return step.step_id, "fallback" if step.fallback else "tool"


def _keys(steps: tuple[CoveredStep, ...]) -> tuple[Key, ...]:
    """Every check on the way to each covered step, in plan order: the sub-flow steps
    around it (outermost first), then the step (or its fallback) itself."""
    keys: dict[Key, None] = {}
    for step in steps:
        parts = step.step_id.split("/")
        for depth in range(1, len(parts)):
            keys.setdefault(("/".join(parts[:depth]), "subflow"))
        keys.setdefault(own_key(step))
    return tuple(keys)


async def caller_now_async(guard: StepGuard) -> Any:
    try:
        caller = guard.caller()
        return await caller if inspect.isawaitable(caller) else caller
    except Exception:
        return None


def caller_now(guard: StepGuard) -> Any:
    try:
        caller = guard.caller()
        return _blocking(caller) if inspect.isawaitable(caller) else caller
    except Exception:
        return None


AskSync = Callable[[ApprovalRequest], "str | None"]
AskAsync = Callable[[ApprovalRequest], Awaitable["str | None"]]


class ApprovedGrants:
    """The step-grant decisions one run's approval covers (shared by the guards of its
    sub-flows), and how to ask that approval again.

    ``ask_sync``/``ask_async`` ask the run's approval hook (None: approved); ``loop``
    is the event loop the run was approved on (None: the sync lane): a question asked
    again from a worker thread or a sub-flow's private loop is asked there.
    """

    def __init__(self, plan: Plan, request: ApprovalRequest, caller: Any,
                 authorizer: bool, ask_sync: AskSync, ask_async: AskAsync,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.request = request
        self.authorizer = authorizer
        self.ask_sync = ask_sync
        self.ask_async = ask_async
        self.loop = loop
        self.keys = _keys(request.steps)
        needs: dict[Key, GrantNeed] = {(n.path, n.kind): n for n in plan.needs}
        self.needs = {key: needs.get(key) for key in self.keys}
        self.caller_id = caller_id(caller)
        self.bases = self._bases(caller)
        self.passed: set[Key] = set()  # checks that ran under this approval
        self.denial: str | None = None  # why the step asked again did not run
        self._lock = asyncio.Lock() if loop is not None else None
        # The run's context (a server's request lives there): a question asked again
        # from a worker thread is asked in it.
        self.context = contextvars.copy_context() if loop is not None else None

    def _bases(self, caller: Any) -> dict[Key, str]:
        result = {}
        for key, need in self.needs.items():
            requires, delegated = (None, None) if need is None \
                else (need.grants, need.delegated)
            result[key] = basis(requires, delegated, caller, self.authorizer)
        return result

    def question(self, changed: str | None = None, caller: Any = None,
                 key: Key | None = None) -> ApprovalRequest:
        """The approval question: first (``changed`` None) every covered step under
        the decisions recorded; asked again, the covered steps that have not run yet
        (and the one at ``key``) under the decisions for ``caller`` now."""
        if changed is None:
            return dataclasses.replace(self.request, grants=self._listed(self.bases),
                                       caller_id=self.caller_id)
        pending = tuple(step for step in self.request.steps
                        if own_key(step) not in self.passed or own_key(step) == key)
        return dataclasses.replace(self.request, steps=pending or self.request.steps,
                                   grants=self._listed(self._bases(caller)),
                                   caller_id=caller_id(caller), changed=changed)

    def _listed(self, bases: dict[Key, str]) -> tuple[tuple[str, str, str], ...]:
        return tuple((path, kind, bases[(path, kind)]) for path, kind in self.keys)

    def _changed(self, request: StepRequest, caller: Any) -> tuple[Key, str] | None:
        """(the check's key, what changed) when this check is not what was approved."""
        key = (request.path, request.kind)
        recorded = self.bases.get(key)
        if recorded is None:
            return None  # not on the way to a covered step
        now = basis(request.requires, request.delegated, caller, self.authorizer)
        if caller_id(caller) != self.caller_id:
            return key, "the run was approved for another caller"
        if now != recorded:
            return key, (f"it was approved as allowed by {_WORDS[recorded]} and is now "
                         f"allowed by {_WORDS[now]}")
        self.passed.add(key)
        return None

    def _settled(self, key: Key, what: str, caller: Any, refused: str | None) -> str | None:
        if refused is not None:
            self.denial = f"{what}; approval was asked again and {refused}"
            return RENEWAL_DENIED
        self.caller_id = caller_id(caller)
        self.bases = self._bases(caller)
        self.passed.add(key)
        return None

    def holds(self, request: StepRequest, caller: Any) -> str | None:
        """From sync code: None when the check is still what was approved (or the
        approval was given again); else :data:`RENEWAL_DENIED`."""
        changed = self._changed(request, caller)
        if changed is None:
            return None
        loop = self.loop
        if loop is None:  # the sync lane: nothing runs beside it
            key, what = changed
            question = self.question(request.path, caller, key)
            return self._settled(key, what, caller, self.ask_sync(question))
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop or loop.is_closed():  # cannot wait for the loop from its own thread
            self.denial = "the step-grant decision changed after approval and the " \
                "approval could not be asked again here"
            return RENEWAL_DENIED
        return self._on_loop(request, caller, loop).result()

    async def holds_async(self, request: StepRequest, caller: Any) -> str | None:
        """:meth:`holds` from a coroutine (on the run's loop, or a sub-flow's own)."""
        if self._changed(request, caller) is None:
            return None
        loop = self.loop
        if loop is None:
            return self.holds(request, caller)
        if asyncio.get_running_loop() is loop:
            return await self._again(request, caller)
        return await asyncio.wrap_future(self._on_loop(request, caller, loop))

    def _on_loop(self, request: StepRequest, caller: Any, loop: asyncio.AbstractEventLoop
                 ) -> concurrent.futures.Future[str | None]:
        # The task asking again starts in the run's context (call_soon_threadsafe
        # copies the context it is called in), from a copy: one context cannot be
        # entered by two threads at once.
        assert self.context is not None
        return self.context.copy().run(asyncio.run_coroutine_threadsafe,
                                       self._again(request, caller), loop)

    async def _again(self, request: StepRequest, caller: Any) -> str | None:
        """Ask again, on the run's loop, one question at a time: a check that waited
        finds it already answered for the decisions as they are now."""
        assert self._lock is not None
        async with self._lock:
            changed = self._changed(request, caller)
            if changed is None:
                return None
            key, what = changed
            question = self.question(request.path, caller, key)
            return self._settled(key, what, caller, await self.ask_async(question))


# ------------------------------------------------- before a run's first step


class _ParentDecided:
    """The type of :data:`PARENT_DECIDED`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PARENT_DECIDED"


# ``approve=`` of a sub-flow's run: the run that started it asked (or was told not to
# ask) for every step of it already. Only the lanes pass it; every other caller passes a
# hook, ALWAYS_APPROVE or None (then a plan that needs approval does not run).
PARENT_DECIDED: Final = _ParentDecided()
Approve = ApprovalHook | _ParentDecided | None
NO_APPROVAL: Final = (None,)  # Plan.approval once no step of it needs approval


def approval_gate(plan: Plan, approve: Approve
                  ) -> ErrorInfo | tuple[ApprovalRequest, ApprovalHook] | None:
    """What a run of ``plan`` must do about approval before its first step.

    None: run (no step needs approval, ``approve`` is :data:`ALWAYS_APPROVE`, or it is
    :data:`PARENT_DECIDED`: a sub-flow). An ``ApprovalRequired`` error: refuse at once
    (steps need approval and ``approve`` is None). (request, hook): ask ``hook`` once
    ``request``, after the input is valid; only ``True`` lets the run start.
    """
    if isinstance(approve, _ParentDecided):
        return None
    request = approval_request(plan)  # worked out once per plan
    if request is None:
        return None
    if approve is None:
        return _located(
            plan, request, "ApprovalRequired",
            f"flow {plan.flow.name!r} {plan.flow.version} has steps that need approval: "
            f"{request.describe()}. No approval hook was given, so no step ran: pass "
            "approve= a hook that asks someone, or approve=ALWAYS_APPROVE to run it "
            "without asking")
    if approve is ALWAYS_APPROVE:
        logger.debug("flow %r %s runs without asking for approval (ALWAYS_APPROVE): %s",
                     plan.flow.name, plan.flow.version, request.describe())
        return None
    return request, approve


def under_grants(plan: Plan, gate: tuple[ApprovalRequest, ApprovalHook],
                 guard: StepGuard | None, caller: Any,
                 loop: asyncio.AbstractEventLoop | None
                 ) -> tuple[ApprovalRequest, ApprovedGrants | None]:
    """The approval question of a run (with a guard: under its step-grant decisions
    for ``caller`` now) and, with a guard, what the approval will cover."""
    request, hook = gate
    if guard is None:
        return request, None
    approved = ApprovedGrants(plan, request, caller, guard.authorizer is not None,
                              lambda asked: ask_blocking(hook, asked),
                              lambda asked: ask_approval(hook, asked), loop)
    return approved.question(), approved


def ask_blocking(approve: ApprovalHook, request: ApprovalRequest) -> str | None:
    """:func:`~chainweaver.run_events.ask_approval` from sync code (an async hook's
    answer is awaited on a private loop)."""
    try:
        answer = approve(request)
        if inspect.isawaitable(answer):
            answer = run_coroutine_blocking(_awaited(answer))
    except Exception as error:
        return hook_raised(error)
    return approval_verdict(answer)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def denied(plan: Plan, request: ApprovalRequest, refused: str | None) -> ErrorInfo | None:
    """The ``ApprovalDenied`` error when the hook did not approve (None: it did)."""
    if refused is None:
        return None
    return _located(
        plan, request, "ApprovalDenied",
        f"flow {plan.flow.name!r} {plan.flow.version}: approval of {request.describe()} "
        f"was asked and {refused}, so no step ran")


def _located(plan: Plan, request: ApprovalRequest, kind: str, message: str) -> ErrorInfo:
    """An error at the first covered step (its top-level step: a sub-flow's step)."""
    index = request.step_index
    return ErrorInfo(kind, message, step_index=index, tool_name=plan.flow.steps[index].name,
                     step_id=plan.flow.step_ids[index])
