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
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from fastmcp import FastMCP
from fastmcp.server.dependencies import get_http_headers
from fastmcp.server.middleware import Middleware, MiddlewareContext
from mcp import MCPError
from mcp_types import INTERNAL_ERROR

from .composition import ADMITTED_BY, find_component, flow_of, owned_meta, reached_directly
from .config import SecurityConfig
from .exposure import ExposedFlow, Exposure
from .hooks import (
    ANONYMOUS,
    GATE_REFUSED,
    AuditEvent,
    AuthorizationDecision,
    CallerIdentity,
    GateContext,
    RequestKind,
)
from .prompts import malformed_prompt_request, refuse_malformed

logger = logging.getLogger("chainweaver.mcp.security")

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
        # A call run as a background task returns its handle, which has no content:
        # the task's own audit records its result (chainweaver.mcp.tasks).
        return "\n".join(getattr(block, "text", "") for block in getattr(result, "content", ()))
    if kind == "resource":
        return "\n".join(
            c.content if isinstance(c.content, str) else c.content.hex() for c in result.contents
        )
    return "\n".join(getattr(m.content, "text", "") for m in result.messages)


class SecurityGate(Middleware):
    """FastMCP middleware applying the gate to tools, resources and prompts alike."""

    def __init__(self, exposure: Exposure, config: SecurityConfig, owner: str = "") -> None:
        self.exposure = exposure
        self.owner = owner  # the mark on every component this server publishes
        self.authenticator = config.authenticator
        self.rate_limiter = config.rate_limiter
        self.authorizer = config.authorizer
        self.audit_hook = config.audit_hook
        self.hook_timeout = config.hook_timeout
        self.active = config.active
        self._warned_composition = False

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
                                         context, refuse_malformed(problem))
        return await call_next(context)

    async def on_call_tool(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("tool", context.message.name, context, call_next)

    async def on_read_resource(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("resource", str(context.message.uri), context, call_next)

    async def on_get_prompt(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("prompt", context.message.name, context, call_next)

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
        """The exposed flow a request for ``name`` on ``server`` reaches, if any."""
        if server is None or not server.transforms:
            return self.published_target(kind, name)
        # A transform added to server.fastmcp (a Namespace, a rename) changes the names
        # clients use: find the component the name resolves to, and its flow from the
        # metadata every component of this server carries, so per-flow authorization
        # follows the flow, whatever its name.
        meta = owned_meta(await find_component(server, kind, name), self.owner)
        return None if meta is None else flow_of(self.exposure, meta)

    async def _guard(
        self, kind: RequestKind, name: str, context: MiddlewareContext, call_next: Any
    ) -> Any:
        if not self.active or ADMITTED_BY.get() is self:
            # No hooks; or a parent server's MountedGate already ran this gate.
            return await call_next(context)
        if not reached_directly(self, context):
            raise self._unsupported_composition(kind, name)
        server = context.fastmcp_context.fastmcp if context.fastmcp_context else None
        exposed = await self.target_in(server, kind, name)
        return await self.guard_target(kind, name, exposed, context, call_next)

    async def guard_target(
        self, kind: RequestKind, name: str, exposed: ExposedFlow | None,
        context: MiddlewareContext, call_next: Any,
    ) -> Any:
        """Authenticate, rate-limit, authorize and audit one request for ``exposed``."""
        gate = GateContext(kind, name, exposed.flow.name if exposed else None,
                           exposed.flow.version if exposed else None,
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
        limiter = self.rate_limiter
        if limiter is not None:
            allowed = await self._call_hook(
                lambda g: limiter.acquire(caller, g.name), gate, "rate_limiter_error", caller,
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


def _with_caller(gate: GateContext, caller: CallerIdentity) -> GateContext:
    return GateContext(gate.kind, gate.name, gate.flow_name, gate.flow_version, gate.headers,
                       caller)
