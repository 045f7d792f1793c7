"""Keeping the security gate in charge when FastMCP composition renames or mounts.

Two compositions are supported:

- A transform added to ``server.fastmcp`` (a ``Namespace``, a ``ToolTransform``
  rename): the gate finds the component a renamed request resolves to and reads
  its flow from the metadata every flow component carries.
- Mounting with :meth:`FlowServer.mount_into`: a :class:`MountedGate` runs this
  server's gate in the parent's middleware chain, so a refusal keeps its
  JSON-RPC shape (a parent turns exceptions raised under a mounted tool into
  ``isError`` results and logs them with a traceback).

Anything else that routes a request into the server without its own transport
(a bare ``FastMCP.mount()``) is refused, loudly, by the gate itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from fastmcp import FastMCP
from fastmcp.server.middleware import Middleware, MiddlewareContext

from .exposure import ExposedFlow, Exposure
from .hooks import RequestKind

if TYPE_CHECKING:
    from .security import SecurityGate

# Key of the gate in the lifespan state of the FastMCP server a FlowServer builds.
GATE_STATE_KEY = "chainweaver_security_gate"
# The gate a parent's MountedGate already ran for the current request.
ADMITTED_BY: ContextVar[SecurityGate | None] = ContextVar("chainweaver_admitted_by",
                                                          default=None)


def gate_lifespan(gate: SecurityGate) -> Callable[[FastMCP], AbstractAsyncContextManager[
        dict[str, Any]]]:
    """A FastMCP lifespan that records ``gate`` in the server's lifespan state.

    Every request a server's own transport receives carries that state; a request a
    parent server delegates through ``FastMCP.mount()`` carries the parent's.
    """

    @asynccontextmanager
    async def lifespan(server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        yield {GATE_STATE_KEY: gate}

    return lifespan


def reached_directly(gate: SecurityGate, context: MiddlewareContext) -> bool:
    """Whether the request came in through the transport of the gate's own server."""
    fastmcp_context = context.fastmcp_context
    request = fastmcp_context.request_context if fastmcp_context else None
    state = getattr(request, "lifespan_context", None)
    return isinstance(state, Mapping) and state.get(GATE_STATE_KEY) is gate


async def find_component(server: FastMCP, kind: RequestKind, name: str) -> Any:
    """The component ``name`` resolves to on ``server`` (transforms applied), or None."""
    try:
        if kind == "tool":
            return await server.get_tool(name)
        if kind == "resource":
            return await server.get_resource(name)
        return await server.get_prompt(name)
    except Exception:  # a malformed URI or name is simply not found
        return None


async def component_flow(exposure: Exposure, server: FastMCP, kind: RequestKind,
                         name: str) -> ExposedFlow | None:
    """The exposed flow behind the component ``name`` resolves to on ``server``."""
    component = await find_component(server, kind, name)
    meta = (getattr(component, "meta", None) or {}).get("chainweaver")
    if not isinstance(meta, Mapping):
        return None
    exposed = exposure.flows.get(meta.get("flow"))  # type: ignore[arg-type]
    if exposed is None or exposed.flow.version != meta.get("version"):
        return None
    return exposed


class MountedGate(Middleware):
    """A mounted FlowServer's gate, run in the parent server's middleware chain."""

    def __init__(self, gate: SecurityGate, child: FastMCP, namespace: str | None) -> None:
        self.gate = gate
        self.child = child
        self.namespace = namespace

    async def on_call_tool(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("tool", context.message.name, context, call_next)

    async def on_read_resource(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("resource", str(context.message.uri), context, call_next)

    async def on_get_prompt(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("prompt", context.message.name, context, call_next)

    def _inner_name(self, kind: RequestKind, name: str) -> str | None:
        """The child's own name for a parent-side name, or None if not the child's."""
        if not self.namespace:
            return name
        if kind != "resource":
            prefix = f"{self.namespace}_"
            return name[len(prefix):] if name.startswith(prefix) else None
        scheme, separator, path = name.partition("://")
        prefix = f"{self.namespace}/"
        if not separator or not path.startswith(prefix):
            return None
        return f"{scheme}://{path[len(prefix):]}"

    async def _guard(self, kind: RequestKind, name: str, context: MiddlewareContext,
                     call_next: Any) -> Any:
        if not self.gate.active:
            return await call_next(context)
        inner = self._inner_name(kind, name)
        if inner is None or (not self.namespace
                             and await find_component(self.child, kind, inner) is None):
            return await call_next(context)  # not this FlowServer's name
        exposed = await self.gate.target_in(self.child, kind, inner)
        admitted = ADMITTED_BY.set(self.gate)
        try:
            return await self.gate.guard_target(kind, name, exposed, context, call_next)
        finally:
            ADMITTED_BY.reset(admitted)
