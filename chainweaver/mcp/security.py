"""The security gate: authenticate -> rate-limit -> authorize -> audit, for every
``tools/call``, ``resources/read`` and ``prompts/get``.

A refused request gets a JSON-RPC error carrying only a reason code. Hooks may be
sync or async; one that raises (or, if async, takes longer than ``hook_timeout``)
refuses the request when it is the authenticator, limiter or authorizer, and is
logged and ignored when it is the audit hook: a broken hook never breaks the server.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from fastmcp.server.dependencies import get_http_headers
from fastmcp.server.middleware import Middleware, MiddlewareContext
from mcp import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from .config import SecurityConfig
from .exposure import Exposure
from .prompts import malformed_prompt_request

logger = logging.getLogger("chainweaver.mcp.security")

RequestKind = Literal["tool", "resource", "prompt"]
# JSON-RPC leaves -32000..-32099 to servers; one code for every gate refusal.
GATE_REFUSED = -32001
# A refusal carries only a reason code, never free text that could leak details.
REASON_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class CallerIdentity:
    """Who is calling, as established by the authenticator."""

    id: str
    claims: Mapping[str, Any] = field(default_factory=dict)


ANONYMOUS = CallerIdentity("anonymous")


@dataclass(frozen=True)
class GateContext:
    """What the gate's hooks see about a request. Argument values are never included."""

    kind: RequestKind
    name: str
    flow_name: str | None
    flow_version: str | None
    headers: Mapping[str, str]
    caller: CallerIdentity | None = None


@dataclass(frozen=True)
class AuthorizationDecision:
    """An authorizer's answer; ``reason`` is the only thing a refused client sees."""

    allowed: bool
    reason: str = "forbidden"

    def __post_init__(self) -> None:
        if not isinstance(self.allowed, bool):
            raise TypeError(f"AuthorizationDecision.allowed must be True or False, got "
                            f"{self.allowed!r}")
        if not isinstance(self.reason, str) or not REASON_CODE.fullmatch(self.reason):
            raise TypeError("AuthorizationDecision.reason must be a short code of letters, "
                            "digits, '_', '.' and '-' (it is sent to the client), got "
                            f"{self.reason!r}")


@dataclass(frozen=True)
class AuditEvent:
    """One audit record. ``phase`` is ``"decision"`` (the gate's verdict) or
    ``"completed"`` (an allowed request finished). Content is never recorded: only
    the SHA-256 and UTF-8 byte length of the returned text."""

    timestamp: float
    phase: Literal["decision", "completed"]
    kind: RequestKind
    name: str
    flow_name: str | None
    flow_version: str | None
    caller_id: str | None
    decision: Literal["allowed", "denied"]
    reason: str
    duration_ms: float | None = None
    outcome: Literal["ok", "error"] | None = None
    error_type: str | None = None
    result_sha256: str | None = None
    result_length: int | None = None


Authenticator = Callable[[GateContext], "CallerIdentity | None | Awaitable[CallerIdentity | None]"]
Authorizer = Callable[[GateContext], "bool | AuthorizationDecision | Awaitable[Any]"]
AuditHook = Callable[[AuditEvent], Any]


class RateLimiter(Protocol):
    def acquire(self, caller: CallerIdentity, name: str) -> bool: ...


PRUNE_ABOVE = 10_000  # counters kept before past windows are dropped


class FixedWindowRateLimiter:
    """At most ``limit`` requests per caller per ``window_seconds`` window.

    With ``per_name=True`` the budget is per caller *and* published name.
    """

    def __init__(
        self,
        limit: int,
        window_seconds: float = 60.0,
        *,
        per_name: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1 or window_seconds <= 0:
            raise ValueError("limit must be >= 1 and window_seconds > 0")
        self.limit = limit
        self.window_seconds = window_seconds
        self.per_name = per_name
        self._clock = clock
        self._windows: dict[Any, tuple[int, int]] = {}
        self._pruned_window = -1
        self._lock = threading.Lock()

    @property
    def tracked_keys(self) -> int:
        """How many counters are held (for monitoring memory use)."""
        return len(self._windows)

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        key = (caller.id, name) if self.per_name else caller.id
        window = int(self._clock() // self.window_seconds)
        with self._lock:
            if window != self._pruned_window and len(self._windows) > PRUNE_ABOVE:
                # Once per window, drop the counts of past windows, so many callers (or
                # names) cannot grow memory without bound.
                self._windows = {k: v for k, v in self._windows.items() if v[0] == window}
                self._pruned_window = window
            current, count = self._windows.get(key, (window, 0))
            if current != window:
                count = 0
            if count >= self.limit:
                self._windows[key] = (window, count)
                return False
            self._windows[key] = (window, count + 1)
            return True


class GateRefused(Exception):
    def __init__(self, reason: str, caller: CallerIdentity | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.caller = caller


def refusal_error(reason: str) -> MCPError:
    return MCPError(code=GATE_REFUSED, message=f"Request refused: {reason}",
                    data={"reason": reason})


def payload_text(kind: RequestKind, result: Any) -> str:
    """The text a request returned, as the audit hashes it."""
    if kind == "tool":
        return "\n".join(getattr(block, "text", "") for block in result.content)
    if kind == "resource":
        return "\n".join(
            c.content if isinstance(c.content, str) else c.content.hex() for c in result.contents
        )
    return "\n".join(getattr(m.content, "text", "") for m in result.messages)


class SecurityGate(Middleware):
    """FastMCP middleware applying the gate to tools, resources and prompts alike."""

    def __init__(self, exposure: Exposure, config: SecurityConfig) -> None:
        self.exposure = exposure
        self.authenticator = config.authenticator
        self.rate_limiter = config.rate_limiter
        self.authorizer = config.authorizer
        self.audit_hook = config.audit_hook
        self.hook_timeout = config.hook_timeout
        self.active = config.active

    async def on_request(self, context: MiddlewareContext, call_next: Any) -> Any:
        # The only hook that sees prompts/get params before the MCP SDK validates
        # them: a malformed request still passes the gate and the audit, then gets
        # -32602 naming what is wrong instead of the SDK's bare message.
        params = context.message
        if context.method == "prompts/get" and isinstance(params, Mapping):
            problem = malformed_prompt_request(params)
            if problem is not None:
                name = params.get("name")
                return await self._guard("prompt", name if isinstance(name, str) else "",
                                         context, _refuse_malformed(problem))
        return await call_next(context)

    async def on_call_tool(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("tool", context.message.name, context, call_next)

    async def on_read_resource(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("resource", str(context.message.uri), context, call_next)

    async def on_get_prompt(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("prompt", context.message.name, context, call_next)

    def _target(self, kind: RequestKind, name: str) -> tuple[str | None, str | None]:
        # Resolved through the exposure decision only, so an excluded flow looks
        # exactly like a name that never existed, to hooks as to clients.
        if kind == "tool":
            exposed = self.exposure.tools.get(name)
        elif kind == "resource":
            exposed = self.exposure.resources.get(name)
        else:
            entry = self.exposure.prompts.get(name)
            exposed = entry.exposed_flow if entry else None
        if exposed is None:
            return None, None
        return exposed.flow.name, exposed.flow.version

    async def _guard(
        self, kind: RequestKind, name: str, context: MiddlewareContext, call_next: Any
    ) -> Any:
        if not self.active:
            return await call_next(context)
        flow_name, flow_version = self._target(kind, name)
        gate = GateContext(kind, name, flow_name, flow_version,
                           get_http_headers(include_all=True))
        try:
            caller = await self._admit(gate)
        except GateRefused as refused:
            await self._audit(gate, refused.caller, "denied", refused.reason)
            raise refusal_error(refused.reason) from None
        await self._audit(gate, caller, "allowed", "ok")

        started = time.perf_counter()
        try:
            result = await call_next(context)
        except Exception as error:
            await self._audit(gate, caller, "allowed", "ok", started=started,
                              outcome="error", error_type=type(error).__name__)
            raise
        try:
            data = payload_text(kind, result).encode("utf-8")
        except UnicodeEncodeError:
            # The transport cannot send it either: never audit "ok" for a reply the
            # client will not receive.
            await self._audit(gate, caller, "allowed", "ok", started=started,
                              outcome="error", error_type="UnsendableResult")
            raise MCPError(code=INTERNAL_ERROR, message="The result cannot be sent") from None
        failed = kind == "tool" and bool(getattr(result, "is_error", False))
        await self._audit(
            gate, caller, "allowed", "ok", started=started,
            outcome="error" if failed else "ok",
            result_sha256=hashlib.sha256(data).hexdigest(), result_length=len(data),
        )
        return result

    async def _admit(self, gate: GateContext) -> CallerIdentity:
        caller = ANONYMOUS
        if self.authenticator is not None:
            identity = await self._call_hook(self.authenticator, gate, "authenticator_error")
            if identity is None:
                raise GateRefused("unauthenticated")
            if not isinstance(identity, CallerIdentity):
                logger.warning("authenticator returned %s, not a CallerIdentity",
                               type(identity).__name__)
                raise GateRefused("authenticator_error")
            caller = identity
        if self.rate_limiter is not None:
            allowed = await self._call_hook(
                lambda g: self.rate_limiter.acquire(caller, g.name), gate,
                "rate_limiter_error", caller,
            )
            if allowed is not True:
                raise GateRefused("rate_limited", caller)
        if self.authorizer is not None:
            decision = await self._call_hook(
                self.authorizer, _with_caller(gate, caller), "authorizer_error", caller
            )
            # Only an explicit yes allows: a truthy string or number is a bug, not consent.
            if isinstance(decision, AuthorizationDecision):
                if decision.allowed is not True:
                    raise GateRefused(decision.reason, caller)
            elif decision is not True:
                raise GateRefused("forbidden", caller)
        return caller

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

    async def _audit(
        self,
        gate: GateContext,
        caller: CallerIdentity | None,
        decision: Literal["allowed", "denied"],
        reason: str,
        *,
        started: float | None = None,
        outcome: Literal["ok", "error"] | None = None,
        error_type: str | None = None,
        result_sha256: str | None = None,
        result_length: int | None = None,
    ) -> None:
        if self.audit_hook is None:
            return
        event = AuditEvent(
            timestamp=time.time(),
            phase="decision" if started is None else "completed",
            kind=gate.kind,
            name=gate.name,
            flow_name=gate.flow_name,
            flow_version=gate.flow_version,
            caller_id=caller.id if caller else None,
            decision=decision,
            reason=reason,
            duration_ms=None if started is None else (time.perf_counter() - started) * 1000,
            outcome=outcome,
            error_type=error_type,
            result_sha256=result_sha256,
            result_length=result_length,
        )
        try:
            value = self.audit_hook(event)
            if inspect.isawaitable(value):
                await asyncio.wait_for(value, self.hook_timeout)
        except Exception as error:  # auditing must never break a request
            logger.warning("audit hook failed: %s", type(error).__name__)


def _refuse_malformed(problem: str) -> Callable[[MiddlewareContext], Awaitable[Any]]:
    async def refuse(context: MiddlewareContext) -> Any:
        raise MCPError(code=INVALID_PARAMS, message=problem)

    return refuse


def _with_caller(gate: GateContext, caller: CallerIdentity) -> GateContext:
    return GateContext(gate.kind, gate.name, gate.flow_name, gate.flow_version, gate.headers,
                       caller)
