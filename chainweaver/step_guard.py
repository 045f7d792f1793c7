"""The guard a run asks before every attempt of every step (:mod:`chainweaver.grants`
says what is declared): the declared grants against the caller as it is *now*, then
the server-wide step authorizer hook, if any, with the step's resolved arguments; and
the decisions of the run, kept for its audit. A run of a plan with no declared grants
and no hook has no guard at all: it pays nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .grants import Delegation, Grants, StepAuthorizer, StepDecision, StepKind, StepRequest

logger = logging.getLogger("chainweaver.grants")
# Decisions one run keeps for its audit; past this they are counted only.
MAX_KEPT_DECISIONS = 16
PATH_LIMIT = 128  # characters of a step path (or target) an audit entry keeps


class StepRefused(Exception):
    """Internal: a step the guard refused; the run stops there, before any effect."""

    def __init__(self, reason: str, path: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path


@dataclass
class Decisions:
    """Every step decision of one run, for its audit: the first
    :data:`MAX_KEPT_DECISIONS` as they were made, the rest counted."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    refusal: dict[str, Any] | None = None  # the first refused attempt
    allowed: int = 0
    denied: int = 0
    delegated: int = 0

    def add(self, path: str, kind: str, target: str, allowed: bool, reason: str,
            delegated: str | None) -> None:
        if allowed:
            self.allowed += 1
        else:
            self.denied += 1
        if delegated is not None:
            self.delegated += 1
        if len(self.kept) < MAX_KEPT_DECISIONS or (not allowed and self.refusal is None):
            entry = {"path": _cut(path), "kind": kind, "target": _cut(target),
                     "decision": "allowed" if allowed else "denied", "reason": reason,
                     "grant": "delegation" if delegated is not None else "caller"}
            if len(self.kept) < MAX_KEPT_DECISIONS:
                self.kept.append(entry)
            if not allowed and self.refusal is None:
                self.refusal = entry

    def summary(self) -> dict[str, Any]:
        total = self.allowed + self.denied
        return {"allowed": self.allowed, "denied": self.denied,
                "delegated": self.delegated, "omitted": max(0, total - len(self.kept)),
                "steps": [dict(entry) for entry in self.kept],
                "refused": None if self.refusal is None else dict(self.refusal)}


def _cut(text: str) -> str:
    return text if len(text) <= PATH_LIMIT else text[:PATH_LIMIT - 1] + "…"


# The caller as it is now (may return an awaitable; None: no caller any more).
CallerSource = Callable[[], Any]


class StepGuard:
    """Asks, before every attempt of every step of one run (and its sub-flows), whether
    the caller may run it now.

    ``caller``: a callable giving the caller as it is *now* (asked at every check, so
    a revoked grant stops the run at its next step). ``authorizer``: the server-wide
    step authorizer hook (None: declared grants only). ``delegations``: paths (in the
    top flow) the flows delegate. ``decisions`` collects what was decided.
    """

    __slots__ = ("caller", "authorizer", "flow_name", "flow_version", "prefix",
                 "delegations", "decisions", "approved", "loop", "context", "awaits")

    def __init__(self, caller: CallerSource, authorizer: StepAuthorizer | None,
                 flow_name: str, flow_version: str, *, prefix: str = "",
                 delegations: tuple[Delegation, ...] = (),
                 decisions: Decisions | None = None, approved: Any = None) -> None:
        self.caller = caller
        self.authorizer = authorizer
        self.flow_name = flow_name
        self.flow_version = flow_version
        self.prefix = prefix
        self.delegations = delegations
        self.decisions = decisions if decisions is not None else Decisions()
        # What the run's approval covers (chainweaver.engine.approved.ApprovedGrants), set
        # once it is approved; None: nothing to compare.
        self.approved = approved
        # The event loop an async run started on, and its context (a server's request
        # lives there): an async hook asked from a worker thread is awaited there.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.context: contextvars.Context | None = None
        # Whether a check awaits a hook (an async caller source or authorizer): such a
        # check waits for the run's loop, so its step never runs on the loop itself.
        self.awaits = _is_async(caller) or _is_async(authorizer)

    def on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Await the hooks' awaitables on ``loop`` (the run's), in the current context,
        wherever a check is asked from: an async hook (a database or HTTP client made on
        the server's loop, the request's FastMCP context) works only there."""
        self.loop = loop
        self.context = contextvars.copy_context()

    def keep_approval(self, approved: Any) -> None:
        """From now on, compare every covered check with what the run's approval
        covers (:class:`chainweaver.engine.approved.ApprovedGrants`)."""
        self.approved = approved

    def path(self, step_id: str) -> str:
        return f"{self.prefix}{step_id}"

    def inner(self, step_id: str, subflow_delegations: tuple[Delegation, ...]
              ) -> StepGuard:
        """The guard of a sub-flow step's run: its steps' paths start with the step's,
        and the sub-flow's own delegations hold inside it."""
        prefix = f"{self.prefix}{step_id}/"
        own = tuple(Delegation(prefix + d.step, d.reason) for d in subflow_delegations)
        guard = StepGuard(self.caller, self.authorizer, self.flow_name, self.flow_version,
                          prefix=prefix, delegations=self.delegations + own,
                          decisions=self.decisions, approved=self.approved)
        guard.loop, guard.context = self.loop, self.context
        return guard

    def delegated(self, path: str) -> str | None:
        for delegation in self.delegations:
            if delegation.covers(path):
                return delegation.reason
        return None

    def request(self, path: str, kind: StepKind, target: str, tool: Any, safety: Any,
                arguments: Mapping[str, Any], requires: Grants | None,
                attempt: int = 1) -> StepRequest:
        return StepRequest(None, self.flow_name, self.flow_version, path, kind, target,
                           tool, safety, MappingProxyType(dict(arguments)), requires,
                           self.delegated(path), attempt)

    def declared(self, request: StepRequest, caller: Any) -> str | None:
        """What ``caller`` (as it is now) lacks of the declared grants (None: nothing,
        or the step is delegated)."""
        if caller is None:
            return "no_caller"
        if request.requires is None or request.delegated is not None:
            return None
        return None if request.requires.held_by(caller) else "missing_grant"

    def decide(self, request: StepRequest) -> str | None:
        """Check ``request`` (from sync code: an async hook or caller source is awaited
        on a private loop); the refusal's reason, or None when the step may run."""
        try:
            caller = self.caller()
            if inspect.isawaitable(caller):
                caller = self._waited(caller)
        except Exception as error:
            _source_failed(error)
            caller = None
        refused = self.declared(request, caller)
        if refused is None and self.authorizer is not None:
            try:
                answer = self.authorizer(_asked(request, caller))
                if inspect.isawaitable(answer):
                    answer = self._waited(answer)
            except Exception as error:
                answer = _hook_failed(self.authorizer, error)
            refused = _verdict(answer)
        if refused is None and self.approved is not None:
            refused = self.approved.holds(request, caller)
        return self._noted(request, refused)

    async def decide_async(self, request: StepRequest) -> str | None:
        """:meth:`decide` on the event loop (an async hook is awaited)."""
        try:
            caller = self.caller()
            if inspect.isawaitable(caller):
                caller = await self._awaited(caller)
        except Exception as error:
            _source_failed(error)
            caller = None
        refused = self.declared(request, caller)
        if refused is None and self.authorizer is not None:
            try:
                answer = self.authorizer(_asked(request, caller))
                if inspect.isawaitable(answer):
                    answer = await self._awaited(answer)
            except Exception as error:
                answer = _hook_failed(self.authorizer, error)
            refused = _verdict(answer)
        if refused is None and self.approved is not None:
            refused = await self.approved.holds_async(request, caller)
        return self._noted(request, refused)

    def _elsewhere(self) -> asyncio.AbstractEventLoop | None:
        """The run's loop, when it is running and this thread is not on it (a worker
        thread, a sub-flow's private loop); else None."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return None
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        return None if here is loop else loop

    def _waited(self, awaitable: Awaitable[Any]) -> Any:
        """``awaitable``'s result, from sync code: on the run's loop when it is
        elsewhere; else (the sync lane) on a private one."""
        loop = self._elsewhere()
        if loop is None:
            return _blocking(awaitable)
        return self._on_loop(awaitable, loop).result()

    async def _awaited(self, awaitable: Awaitable[Any]) -> Any:
        loop = self._elsewhere()
        if loop is None:
            return await awaitable
        return await asyncio.wrap_future(self._on_loop(awaitable, loop))

    def _on_loop(self, awaitable: Awaitable[Any], loop: asyncio.AbstractEventLoop
                 ) -> concurrent.futures.Future[Any]:
        # Started from a copy of the run's context (call_soon_threadsafe copies the one
        # it is called in): one context cannot be entered by two threads at once, and
        # the steps of parallel branches check at the same time.
        assert self.context is not None
        return self.context.copy().run(asyncio.run_coroutine_threadsafe,
                                       _awaited(awaitable), loop)

    def _noted(self, request: StepRequest, refused: str | None) -> str | None:
        self.decisions.add(request.path or "(flow)", request.kind, request.target,
                           refused is None, refused or "ok", request.delegated)
        return refused


def _is_async(hook: Any) -> bool:
    """Whether ``hook`` is an async function (a partial of one, an object whose
    ``__call__`` is one)."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    if inspect.iscoroutinefunction(hook):
        return True
    # An object of a class with an async __call__ (looked up as a call would find it).
    return inspect.iscoroutinefunction(inspect.getattr_static(hook, "__call__", None))


def _source_failed(error: Exception) -> None:
    """A caller source (``refresh_caller``) that raised: no caller, so the step is
    refused (``no_caller``), and the operator's log says why."""
    logger.warning("asking for the caller as it is now raised %s: step refused",
                   type(error).__name__)


def _hook_failed(hook: Any, error: Exception) -> StepDecision:
    """A hook that raised refuses the step (and the operator's log says why)."""
    logger.warning("step authorizer %s raised %s: step refused",
                   getattr(hook, "__name__", "hook"), type(error).__name__)
    return StepDecision(False, "step_authorizer_error")


def _blocking(awaitable: Awaitable[Any]) -> Any:
    # An async hook asked from the sync lane, which may itself run inside an event loop:
    # a fresh loop on a worker thread serves both (and keeps this module below calling).
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _awaited(awaitable)).result()


def _asked(request: StepRequest, caller: Any) -> StepRequest:
    return StepRequest(caller, request.flow_name, request.flow_version, request.path,
                       request.kind, request.target, request.tool, request.safety,
                       request.arguments, request.requires, request.delegated,
                       request.attempt)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _verdict(answer: Any) -> str | None:
    """None when the hook allowed the step; else the reason code. Only an explicit yes
    allows."""
    if isinstance(answer, StepDecision):
        if answer.allowed is True:
            return None
        reason = answer.reason
        return reason if isinstance(reason, str) and reason else "forbidden"
    return None if answer is True else "forbidden"


def fixed_caller(caller: Any) -> CallerSource:
    """A caller source for a caller that does not change during the run."""
    return lambda: caller
