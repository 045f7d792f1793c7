"""The security gate: authenticate -> rate-limit -> authorize -> audit, for every
``tools/call``, ``resources/read`` and ``prompts/get``; authenticate -> rate-limit ->
audit for the lists (``tools/list``, ``resources/list``, ``resources/templates/list``,
``prompts/list``), ``completion/complete``, the subscriptions
(``subscriptions/listen``, ``resources/subscribe``, ``resources/unsubscribe``) and the
background-task requests (``tasks/get``, ``tasks/cancel``, ``tasks/update``).

Every request is admitted here once, in that order, with the target resolved in the
authenticated caller's view (see :mod:`.views`); what was decided is the request's
:class:`~.admission.Admission`, which everything after the gate reads. A flow outside
the caller's view is, to every later hook, the audit and the client, a name that never
existed. Without hooks the gate still admits (caller from the verified token, target
in its view); it just calls and audits nothing.

A refused request gets a JSON-RPC error carrying only a reason code. Hooks may be
sync or async; one that raises (or, if async, takes longer than ``hook_timeout``)
refuses the request when it is the authenticator, limiter or authorizer, and is
logged and ignored when it is the audit hook: a broken hook never breaks the server.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import anyio
from fastmcp import FastMCP
from fastmcp.server.dependencies import get_http_headers
from fastmcp.server.middleware import MiddlewareContext
from mcp import MCPError
from mcp_types import INTERNAL_ERROR

from chainweaver.mcp.config import SecurityConfig
from chainweaver.mcp.gate import admission, log_level
from chainweaver.mcp.gate.admission import Admission, RunNote, caller_from_token
from chainweaver.mcp.gate.body_cap import BODY_TOO_LARGE, BodyTooLarge
from chainweaver.mcp.gate.composition import (
    find_component,
    flow_of,
    owned_meta,
    reached_directly,
    runs_root,
)
from chainweaver.mcp.gate.front_door import FrontDoor, Pins
from chainweaver.mcp.gate.malformed import malformed_prompt_request, refuse_malformed
from chainweaver.mcp.gate.rate_limit import budget_name
from chainweaver.mcp.gate.requests import (
    UNSENDABLE,
    completed,
    completion_target,
    gate_for,
    task_id_of,
    with_caller,
)
from chainweaver.mcp.gate.serving import AdmittedServing, RequestCounting, RunWatching
from chainweaver.mcp.gate.views import View, Views
from chainweaver.mcp.hooks import (
    ANONYMOUS,
    GATE_REFUSED,
    AuditEvent,
    AuthorizationDecision,
    CallerIdentity,
    GateContext,
    RequestKind,
    approval_decision,
    deliver_audit,
)
from chainweaver.mcp.publish.exposure import ExposedFlow, Exposure
from chainweaver.mcp.publish.run_uris import RUNS_URI, is_run_uri

logger = logging.getLogger("chainweaver.mcp.gate.security")

# Requests that subscribe to change notifications: gated like lists (kind
# "subscription"); the caller admitted is the one whose view they follow.
SUBSCRIPTION_METHODS = frozenset({"subscriptions/listen", "resources/subscribe",
                                  "resources/unsubscribe"})
# It subscribes a 2025-11-25 session to run log messages: gated like the above.
LOG_LEVEL_METHOD = "logging/setLevel"
# The tasks extension's requests (fastmcp-tasks): FastMCP dispatches them through the
# middleware's on_request only.
TASK_METHODS = frozenset({"tasks/get", "tasks/cancel", "tasks/update"})


class GateRefused(Exception):
    def __init__(self, reason: str, caller: CallerIdentity | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.caller = caller


def refusal_error(reason: str) -> MCPError:
    return MCPError(code=GATE_REFUSED, message=f"Request refused: {reason}",
                    data={"reason": reason})


def refused_reason(error: BaseException) -> str | None:
    """The reason of a gate refusal (:func:`refusal_error`) ``error`` is, else None."""
    if isinstance(error, MCPError) and error.error.code == GATE_REFUSED \
            and isinstance(error.error.data, Mapping):
        reason = error.error.data.get("reason")
        return reason if isinstance(reason, str) else None
    return None


class SecurityGate(FrontDoor):
    """FastMCP middleware applying the gate to every request: the server's only one.

    ``pins`` pins each request to a snapshot first (:mod:`.front_door`); ``refusals``
    counts refusals. What it admits is served as :mod:`.serving` says: counted and timed
    by ``requests``, each flow run watched by ``runs``, a prompt or read capped at
    ``body_limit`` bytes.
    """

    def __init__(self, exposure: Exposure, config: SecurityConfig, owner: str = "",
                 views: Views | None = None, *,
                 refusals: Callable[[GateContext, Exposure, str], None] | None = None,
                 requests: RequestCounting | None = None, runs: RunWatching | None = None,
                 body_limit: int | None = None, pins: Pins | None = None,
                 run_target: Callable[[str], Awaitable[ExposedFlow | None]] | None = None
                 ) -> None:
        self.exposure = exposure
        self.pins = pins
        self.refusals = refusals
        self.serving = AdmittedServing(owner, body_limit, requests, runs)
        self.owner = owner  # the mark on every component this server publishes
        self.views = views or Views(None)
        self.authenticator = config.authenticator
        self.rate_limiter = config.rate_limiter
        self.authorizer = config.authorizer
        self.audit_hook = config.audit_hook
        self.hook_timeout = config.hook_timeout
        self.active = config.active
        self._warned_composition = False
        self.keeps_sessions = True  # False while serving stateless HTTP
        # With run resources: the flow of the caller's run a run URI names
        # (chainweaver.mcp.components.run_resources).
        self.run_target = run_target

    def without_sessions(self) -> None:
        """Serving stateless HTTP: no session keeps a log level (``logging/setLevel``
        answers for the request alone)."""
        self.keeps_sessions = False

    async def on_request(self, context: MiddlewareContext, call_next: Any) -> Any:
        # The only hook that sees prompts/get params before the MCP SDK validates
        # them: a malformed request still passes the gate and the audit, then gets
        # -32602 naming what is wrong instead of the SDK's bare message.
        params = context.message
        if context.method == "prompts/get" and isinstance(params, Mapping):
            problem = malformed_prompt_request(params)
            if problem is not None:
                name = params.get("name")
                return await self.guard("prompt", name if isinstance(name, str) else "",
                                         context, refuse_malformed(problem))
        if context.method == "completion/complete":
            return await self.guard_listing("completion", completion_target(params),
                                             context, call_next)
        if context.method in SUBSCRIPTION_METHODS:
            return await self.guard_listing("subscription", context.method, context,
                                             call_next)
        if context.method in TASK_METHODS:
            return await self._guard_task(context, call_next)
        if context.method == LOG_LEVEL_METHOD:  # kept only for a caller it admits
            return await self.guard_listing("subscription", LOG_LEVEL_METHOD, context,
                                             log_level.setting(call_next,
                                                               self.keeps_sessions))
        return await call_next(context)

    async def _guard_task(self, context: MiddlewareContext, call_next: Any) -> Any:
        """Authenticate, rate-limit and audit ``tasks/get``, ``tasks/cancel`` and
        ``tasks/update`` (``kind="task"``, the method as name), and serve them as the
        caller: the tasks extension answers only that caller's tasks, in its view."""
        task_id = task_id_of(context.message)
        return await self.guard_listing("task", context.method or "", context, call_next,
                                         task_id=task_id)

    async def guard_listing(self, kind: RequestKind, name: str, context: MiddlewareContext,
                             call_next: Any, *, mounted: bool = False,
                             task_id: str | None = None, count: bool | None = None) -> Any:
        """Authenticate, rate-limit and audit a list, a completion, a subscription or a
        task request (never authorized: the caller's view narrows what it shows or
        tells). ``mounted``: run by a parent's :class:`MountedGate`, for a request that
        came in through the parent; ``count``: whether its request metrics count it
        here (default: unless mounted, when this server's own chain counts it)."""
        held = admission.current()
        nested = held.nested_in(self.owner) if held is not None else None
        if nested is not None:
            # Admitted by this gate already: by the parent's MountedGate, or this is a
            # list a tool the gate admitted makes (resources_as_tools / prompts_as_tools).
            listing = nested.listing(kind, name)
            with admission.admitted(listing):
                return await self.serving.count(listing, context, call_next)
        if not (mounted or reached_directly(self, context)):
            return await call_next(context)
        gate = GateContext(kind, name, None, None, get_http_headers(include_all=True))
        if not self.active:
            token_caller = caller_from_token()
            return await self.serving.serve(admission.gate_record(
                held, token_caller, self.views.of(self.exposure, token_caller), self.owner,
                kind, name, None), context, call_next)
        try:
            caller = await self.authenticate(gate)
            await self._limit(gate, caller)
        except GateRefused as refused:
            await self._audit(gate, refused.caller, "denied", refused.reason, task_id=task_id)
            raise refusal_error(refused.reason) from None
        admission.learn_caller(caller, gate)
        await self._audit(gate, caller, "allowed", "ok", task_id=task_id)
        started = time.perf_counter()
        record = admission.gate_record(held, caller, self.views.of(self.exposure, caller),
                                       self.owner, kind, name, None, asked=gate)
        result = await self._run_admitted(record, context, call_next, gate, started,
                                          task_id=task_id,
                                          count=not mounted if count is None else count)
        await self._audit(gate, caller, "allowed", "ok", started=started, outcome="ok",
                          task_id=task_id)
        return result

    def undecided(self, caller: CallerIdentity, kind: RequestKind, name: str) -> Admission:
        """An undecided admission of ``caller``'s request, inside the request's record
        so far: for looking its name up in that caller's view."""
        return admission.gate_record(admission.current(), caller,
                                     self.views.of(self.exposure, caller), self.owner, kind,
                                     name, None, decided=False)

    def _approvals(self, gate: GateContext, caller: CallerIdentity
                   ) -> Callable[[str, str], Awaitable[None]] | None:
        """How the approval answers of a call admitted as ``gate`` are audited."""
        if self.audit_hook is None:
            return None

        async def audit(step_id: str, answer: str) -> None:
            await self._audit(gate, caller, approval_decision(answer), answer,
                              phase="approval", step_id=step_id)

        return audit

    async def _run_admitted(self, record: Admission, context: MiddlewareContext,
                            call_next: Any, gate: GateContext, started: float,
                            *, task_id: str | None = None, count: bool = True) -> Any:
        """Serve an admitted request as ``record`` says; audit it if it is cancelled (a
        listen stream ends so too) or raises."""
        caller = record.caller
        try:
            return await self.serving.serve(record, context, call_next, count=count)
        except BodyTooLarge:
            # Refused after it was served: the body never leaves (see body_cap).
            await self._audit(gate, caller, "denied", BODY_TOO_LARGE, started=started,
                              outcome="error", error_type="BodyTooLarge", task_id=task_id)
            raise
        except asyncio.CancelledError:
            # Shielded, so an async audit hook still runs.
            with anyio.CancelScope(shield=True):
                await self._audit(gate, caller, "allowed", "ok", started=started,
                                  outcome="cancelled", task_id=task_id)
            raise
        except Exception as error:
            refused = refused_reason(error) if record.kind == "subscription" else None
            if refused is not None:
                # Refused by what serves it (a listen stream over its cap, see
                # chainweaver.mcp.live.notifications): audited as the denial it is.
                await self._audit(gate, caller, "denied", refused, started=started,
                                  outcome="error", error_type=type(error).__name__,
                                  task_id=task_id)
                raise
            await self._audit(gate, caller, "allowed", "ok", started=started,
                              outcome="error", error_type=type(error).__name__,
                              task_id=task_id)
            raise

    def published_target(self, kind: RequestKind, name: str) -> ExposedFlow | None:
        """The exposed flow a published name belongs to (None: no flow, or not published).

        Resolved through the exposure decision only, so an excluded flow looks
        exactly like a name that never existed, to hooks as to clients.
        """
        if kind == "tool":
            return self.exposure.tool(name)
        if kind == "resource":
            return self.exposure.resource(name)
        entry = self.exposure.prompt(name)
        return entry.exposed_flow if entry else None

    async def target_in(self, server: FastMCP | None, kind: RequestKind, name: str
                        ) -> ExposedFlow | None:
        """The exposed flow a request for ``name`` on ``server`` (None: no transform
        renames its names) reaches, if any (for a run URI: the flow of that run, when
        the current caller started it)."""
        if server is None:
            if kind == "resource" and self.run_target is not None and is_run_uri(name):
                return await self.run_target(name)
            return self.published_target(kind, name)
        # A transform added to server.fastmcp (a Namespace, a rename) changes the names
        # clients use: find the component the name resolves to, and its flow from the
        # metadata every component of this server carries (a run's resource: its
        # run's), so per-flow authorization follows the flow, whatever its name.
        meta = owned_meta(await find_component(server, kind, name), self.owner)
        return None if meta is None else flow_of(self.exposure, meta)

    async def guard(
        self, kind: RequestKind, name: str, context: MiddlewareContext, call_next: Any
    ) -> Any:
        held = admission.current()
        server = context.fastmcp_context.fastmcp if context.fastmcp_context else None
        if held is not None and held.admits(self.owner, kind)[0]:
            # A parent's MountedGate ran this gate: counted here, under this server's
            # own names (the parent's carry its namespace; this server's own transforms
            # may still move its run resources).
            own = RUNS_URI if self.serving.requests is None or kind != "resource" \
                or server is None else await runs_root(server.transforms)
            # Served as this gate's record: another FlowServer mounted in the same
            # parent admitted the request after it (its caller, its runs root).
            record = held.of(self.owner)
            assert record is not None
            with admission.admitted(record):
                return await self.serving.count(record, context, call_next, own)
        if self.active and not reached_directly(self, context):
            raise self._unsupported_composition(kind, name)
        renamed = server if server is not None and server.transforms else None
        # Looked up as the caller when the answer depends on who asks: a transform's
        # lookup goes through the provider (the caller's view), a run URI names one of
        # the caller's own runs.
        if renamed is None and not (kind == "resource" and is_run_uri(name)):
            return await self.guard_target(kind, name, None, context, call_next)
        # A transform may move the run resources (a Namespace does): a read there is a
        # run read, and a call's large output is linked there.
        root = RUNS_URI if renamed is None or kind == "prompt" \
            else await runs_root(renamed.transforms)
        return await self.guard_target(kind, name,
                                       lambda: self.target_in(renamed, kind, name),
                                       context, call_next, runs_root=root)

    async def guard_target(
        self, kind: RequestKind, name: str,
        resolve: Callable[[], Awaitable[ExposedFlow | None]] | None,
        context: MiddlewareContext, call_next: Any,
        authenticated: CallerIdentity | None = None, mounted: bool = False,
        runs_root: str = RUNS_URI,
    ) -> Any:
        """Admit one request: authenticate, resolve its flow in *that caller's* view,
        rate-limit, authorize, audit; then serve it as the caller.

        The authenticator sees the request's name only. ``resolve`` runs once the caller
        is known, as that caller (see :meth:`_resolve`; None: the flow the published
        name belongs to, whoever asks); a flow outside the caller's view is ``None`` to
        every later hook and the audit, exactly like a name that never existed.
        ``runs_root``: where the request's client reaches the run resources (a read
        there is a run read, whatever run it names; see :mod:`.composition`).
        ``mounted``: run by a parent's :class:`MountedGate` for a request this server's
        own chain serves, and counts, under its own names.
        """
        if kind == "resource" and is_run_uri(name, runs_root):
            # A run read, where this composition put the run resources: its caller's
            # alone (the cache hints, outside every gate, cannot tell).
            admission.answer_per_caller()
        held = admission.current()
        # Admitted already: this request runs inside one the gate admitted (a tool that
        # resources_as_tools / prompts_as_tools added reads through the server): same
        # caller, same rate-limit unit; the read itself is still authorized and audited.
        nested = held.nested_in(self.owner) if held is not None else None
        admitted = nested.caller if nested is not None else None
        if not self.active:  # no hook reads the request: only its kind and name count
            token_caller = admitted or caller_from_token()
            view = self.views.of(self.exposure, token_caller)
            exposed = await self._resolve(held, token_caller, kind, name, resolve, view)
            return await self.serving.serve(admission.gate_record(
                held, token_caller, view, self.owner, kind, name, exposed,
                runs_root=runs_root), context, call_next, count=not mounted)
        headers = get_http_headers(include_all=True)
        gate = gate_for(kind, name, None, headers)
        caller: CallerIdentity | None = admitted
        try:
            if admitted is None:
                caller = authenticated or await self.authenticate(gate)
            assert caller is not None
            view = self.views.of(self.exposure, caller)
            exposed = await self._resolve(held, caller, kind, name, resolve, view)
            gate = gate_for(kind, name, exposed, headers)
            if admitted is None:
                await self._limit(gate, caller, runs_root)
            await self._authorize(gate, caller)
        except GateRefused as refused:
            await self._audit(gate, refused.caller, "denied", refused.reason,
                              runs_root=runs_root)
            raise refusal_error(refused.reason) from None
        if admitted is None:
            # What the authenticator was asked (the name only, no flow).
            admission.learn_caller(caller, gate_for(kind, name, None, headers))
        await self._audit(gate, caller, "allowed", "ok")

        started = time.perf_counter()
        # Where the run a call starts notes what its audit needs (see RunNote).
        note = RunNote() if kind == "tool" else None
        record = admission.gate_record(
            held, caller, view, self.owner, kind, name, exposed, run=note,
            audit_approval=self._approvals(gate, caller) if kind == "tool" else None,
            runs_root=runs_root)
        result = await self._run_admitted(record, context, call_next, gate, started,
                                          count=not mounted)
        done = completed(kind, result, note)
        refusal = done.steps.get("refused") if done.steps is not None else None
        if refusal is not None:
            # A step the run refused for this caller: its own record, beside the call's.
            await self._audit(gate, caller, "denied", refusal["reason"], phase="step",
                              step_id=refusal["path"])
        await self._audit(gate, caller, "allowed", "ok", started=started,
                          outcome=done.outcome, error_type=done.error_type,
                          result_sha256=done.result_sha256, result_length=done.result_length,
                          steps=done.steps)
        if done.error_type == UNSENDABLE:
            # The transport cannot send it either: audited as an error, never "ok" for a
            # reply the client will not receive.
            raise MCPError(code=INTERNAL_ERROR, message="The result cannot be sent")
        return result

    def _unsupported_composition(self, kind: RequestKind, name: str) -> MCPError:
        # The request did not come through this server's transport: it was routed in
        # by another FastMCP server (FastMCP.mount()), where a refusal would be
        # reshaped into a tool result. Refuse rather than serve it unguarded.
        if not self._warned_composition:
            self._warned_composition = True
            logger.error(
                "a request for %s %r reached this FlowServer through another FastMCP "
                "server; mount it with FlowServer.mount_into(parent) so the security gate "
                "runs there. Refusing such requests.", kind, name)
        return refusal_error("unsupported_composition")

    async def _resolve(self, held: Admission | None, caller: CallerIdentity,
                       kind: RequestKind, name: str,
                       resolve: Callable[[], Awaitable[ExposedFlow | None]] | None,
                       view: View) -> ExposedFlow | None:
        """The exposed flow the request reaches in ``caller``'s ``view`` (None: none, or
        one outside the view, exactly like a name that never existed). ``resolve`` is
        for lookups that depend on the caller (a transform's goes through FastMCP and
        the provider, a run URI's finds the caller's own run): it runs as the caller.
        None: the published name's flow."""
        if resolve is None:
            exposed = self.published_target(kind, name)
        else:
            with admission.admitted(admission.gate_record(held, caller, view, self.owner,
                                                          kind, name, None, decided=False)):
                exposed = await resolve()
        return exposed if view.allows(exposed) else None

    async def admit_outside_mcp(self, gate: GateContext, caller: CallerIdentity | None
                                ) -> CallerIdentity | None:
        """Admit a request made outside MCP (the server card): the authenticator (if
        set) replaces ``caller``, then the limiter; audited. None: unauthenticated."""
        try:
            if self.authenticator is not None:
                caller = await self.authenticate(gate)
            await self._limit(gate, caller or ANONYMOUS)
        except GateRefused as refused:
            await self._audit(gate, refused.caller, "denied", refused.reason)
            if refused.reason == "unauthenticated":
                return None
            raise
        await self._audit(gate, caller, "allowed", "ok")
        return caller

    async def authenticate(self, gate: GateContext) -> CallerIdentity:
        """The authenticator's caller; without one, the verified token's (or anonymous)."""
        if self.authenticator is None:
            return caller_from_token()
        identity = await self._call_hook(self.authenticator, gate, "authenticator_error")
        if identity is None:
            raise GateRefused("unauthenticated")
        if not isinstance(identity, CallerIdentity):
            logger.warning("authenticator returned %s, not a CallerIdentity",
                           type(identity).__name__)
            raise GateRefused("authenticator_error")
        return identity

    async def _limit(self, gate: GateContext, caller: CallerIdentity,
                     runs_root: str = RUNS_URI) -> None:
        limiter = self.rate_limiter
        if limiter is not None:
            allowed = await self._call_hook(
                # The budget name, never a caller-chosen name that is not published.
                lambda g: limiter.acquire(caller, budget_name(g, self.exposure, runs_root)),
                gate,
                "rate_limiter_error", caller,
            )
            if allowed is not True:
                raise GateRefused("rate_limited", caller)

    async def _authorize(self, gate: GateContext, caller: CallerIdentity) -> None:
        if self.authorizer is not None:
            decision = await self._call_hook(
                self.authorizer, with_caller(gate, caller), "authorizer_error", caller
            )
            # Only an explicit yes allows: a truthy string or number is a bug, not consent.
            if isinstance(decision, AuthorizationDecision):
                if decision.allowed is not True:
                    raise GateRefused(decision.reason, caller)
            elif decision is not True:
                raise GateRefused("forbidden", caller)

    async def _call_hook(
        self,
        hook: Callable[[Any], Any],
        argument: Any,
        failure: str,
        caller: CallerIdentity | None = None,
    ) -> Any:
        try:
            value = hook(argument)
            if inspect.isawaitable(value):
                value = await asyncio.wait_for(value, self.hook_timeout)
            return value
        except GateRefused:
            raise
        except Exception as error:  # the client learns only the reason code
            logger.warning("%s: %s raised %s", failure, getattr(hook, "__name__", "hook"),
                           type(error).__name__)
            raise GateRefused(failure, caller) from None

    async def _audit(self, gate: GateContext, caller: CallerIdentity | None,
                     decision: Literal["allowed", "denied"], reason: str, *,
                     started: float | None = None,
                     outcome: Literal["ok", "error", "cancelled"] | None = None,
                     error_type: str | None = None, result_sha256: str | None = None,
                     result_length: int | None = None,
                     phase: Literal["approval", "step"] | None = None,
                     step_id: str | None = None, task_id: str | None = None,
                     runs_root: str = RUNS_URI, steps: Mapping[str, Any] | None = None
                     ) -> None:
        # A refusal while serving (started) is counted by the request's own timer.
        if decision == "denied" and started is None and phase != "step" \
                and self.refusals is not None:
            self.refusals(gate, self.exposure, runs_root)
        if self.audit_hook is None:
            return
        event = AuditEvent(
            timestamp=time.time(), phase=phase or ("decision" if started is None else
                                                   "completed"),
            kind=gate.kind, name=gate.name, flow_name=gate.flow_name,
            flow_version=gate.flow_version, caller_id=caller.id if caller else None,
            decision=decision, reason=reason,
            duration_ms=None if started is None else (time.perf_counter() - started) * 1000,
            outcome=outcome, error_type=error_type, result_sha256=result_sha256,
            result_length=result_length, step_id=step_id, task_id=task_id, steps=steps)
        await deliver_audit(self.audit_hook, event, self.hook_timeout)

