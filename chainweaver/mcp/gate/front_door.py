"""Where every request enters the server, in the order it is handled.

1. **Pin**: the request is served from one snapshot of the exposure, whatever changes
   while it runs (``pins``: :class:`~chainweaver.mcp.live.notifications.SnapshotPins`,
   which also remembers 2025-11-25 sessions).
2. **Admit**: a ``tools/call``, ``resources/read`` or ``prompts/get`` goes to ``guard``
   (:meth:`SecurityGate.guard_target <chainweaver.mcp.gate.security.SecurityGate.guard_target>`:
   authenticate, resolve the name in the caller's view, rate-limit, authorize, audit);
   a list, completion, subscription or task request to ``guard_listing`` (the same,
   never authorized: the caller's view narrows what it shows).
3. **Serve**: the admitted request runs as its admission
   (:meth:`AdmittedServing.serve <chainweaver.mcp.gate.serving.AdmittedServing.serve>`),
   its request metrics and run span finished by plain calls at the end; the gate then
   audits how it completed.

The security gate and its mounted twin (:mod:`.mounting`) are both front doors; each
room on the way is entered once per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fastmcp.server.middleware import Middleware, MiddlewareContext

from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.admission import Admission
from chainweaver.mcp.hooks import RequestKind


class Pins(Protocol):
    """Pins each request to the exposure snapshot current when it arrives."""

    def pin(self, context: MiddlewareContext) -> Admission | None:
        """The request's first admission, its snapshot pinned (None: pinned already)."""
        ...


def named_target(context: MiddlewareContext) -> tuple[RequestKind, str] | None:
    """The kind and name of a ``tools/call``, ``resources/read`` or ``prompts/get`` whose
    params FastMCP validated (None: any other message, or raw params FastMCP shows its
    hooks when a request failed before it was dispatched)."""
    message = context.message
    if isinstance(message, Mapping):
        return None
    if context.method == "tools/call":
        return "tool", message.name
    if context.method == "resources/read":
        return "resource", str(message.uri)
    if context.method == "prompts/get":
        return "prompt", message.name
    return None


class FrontDoor(Middleware):
    """FastMCP's hooks the gate and its mounted twin take over: every message is pinned
    to a snapshot first, then a call, read or render goes through ``guard``, a list
    through ``guard_listing``."""

    pins: Pins | None = None

    async def __call__(self, context: MiddlewareContext, call_next: Any) -> Any:
        pinned = self.pins.pin(context) if self.pins is not None else None
        if pinned is None:
            return await self._enter(context, call_next)
        with admission.admitted(pinned):
            return await self._enter(context, call_next)

    async def _enter(self, context: MiddlewareContext, call_next: Any) -> Any:
        # A call, read or render goes straight to the guard: FastMCP's per-hook dispatch
        # costs every request a handful of frames and closures (overriding __call__ is
        # its documented way to handle a message whole). Anything else is dispatched.
        target = named_target(context)
        if target is None:
            return await super().__call__(context, call_next)
        kind, name = target
        return await self.guard(kind, name, context, call_next)

    async def guard(self, kind: RequestKind, name: str, context: MiddlewareContext,
                     call_next: Any) -> Any:
        raise NotImplementedError

    async def guard_listing(self, kind: RequestKind, name: str, context: MiddlewareContext,
                             call_next: Any) -> Any:
        raise NotImplementedError

    async def on_list_tools(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self.guard_listing("list", "tools/list", context, call_next)

    async def on_list_resources(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self.guard_listing("list", "resources/list", context, call_next)

    async def on_list_resource_templates(self, context: MiddlewareContext,
                                         call_next: Any) -> Any:
        return await self.guard_listing("list", "resources/templates/list", context,
                                         call_next)

    async def on_list_prompts(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self.guard_listing("list", "prompts/list", context, call_next)
