"""Keeping the security gate in charge when FastMCP composition renames or mounts.

Two compositions are supported:

- A transform added to ``server.fastmcp`` (a ``Namespace``, a ``ToolTransform``
  rename): the gate finds the component a renamed request resolves to and reads
  its flow from the metadata every flow component carries.
- Mounting with :meth:`FlowServer.mount_into`: a :class:`MountedGate` runs this
  server's gate in the parent's middleware chain, so a refusal keeps its
  JSON-RPC shape (a parent turns exceptions raised under a mounted tool into
  ``isError`` results and logs them with a traceback).

Both find "their" components by the owner mark every component of a FlowServer
carries in ``_meta.chainweaver.server``, whatever name transforms gave it.

Anything else that routes a request into the server without its own transport
(a bare ``FastMCP.mount()``) is refused, loudly, by the gate itself.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types
from fastmcp import FastMCP
from fastmcp.server.middleware import Middleware, MiddlewareContext

from . import log_level
from .exposure import ExposedFlow, Exposure
from .fastmcp_seams import completion_handler
from .hooks import RequestKind
from .prompts import malformed_prompt_request, refuse_malformed

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


def stamp_owner(component: Any, owner: str) -> None:
    """Mark a component as published by the FlowServer whose gate has ``owner``.

    The mark travels with the component's metadata through transforms and mounts, so
    a gate can tell its own components from anyone else's under any name.
    """
    meta = dict(component.meta or {})
    meta["chainweaver"] = {**meta.get("chainweaver", {}), "server": owner}
    component.meta = meta


def owned_meta(component: Any, owner: str) -> Mapping[str, Any] | None:
    """The component's ``chainweaver`` metadata if ``owner`` published it, else None."""
    meta = (getattr(component, "meta", None) or {}).get("chainweaver")
    if not isinstance(meta, Mapping) or meta.get("server") != owner:
        return None
    return meta


def flow_of(exposure: Exposure, meta: Mapping[str, Any]) -> ExposedFlow | None:
    """The exposed flow a component's metadata names (None: the index, the guide...)."""
    flow_name = meta.get("flow")
    exposed = exposure.flow(flow_name) if isinstance(flow_name, str) else None
    if exposed is None or exposed.flow.version != meta.get("version"):
        return None
    return exposed


class GateHooks(Middleware):
    """FastMCP's hooks the gate and its mounted twin take over: a call, read or render
    goes through ``_guard`` (authenticated, rate-limited, authorized and audited), a
    list through ``_guard_listing`` (the same, never authorized: the caller's view
    narrows it)."""

    async def _guard(self, kind: RequestKind, name: str, context: MiddlewareContext,
                     call_next: Any) -> Any:
        raise NotImplementedError

    async def _guard_listing(self, kind: RequestKind, name: str, context: MiddlewareContext,
                             call_next: Any) -> Any:
        raise NotImplementedError

    async def on_call_tool(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("tool", context.message.name, context, call_next)

    async def on_read_resource(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("resource", str(context.message.uri), context, call_next)

    async def on_get_prompt(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard("prompt", context.message.name, context, call_next)

    async def on_list_tools(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard_listing("list", "tools/list", context, call_next)

    async def on_list_resources(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard_listing("list", "resources/list", context, call_next)

    async def on_list_resource_templates(self, context: MiddlewareContext,
                                         call_next: Any) -> Any:
        return await self._guard_listing("list", "resources/templates/list", context,
                                         call_next)

    async def on_list_prompts(self, context: MiddlewareContext, call_next: Any) -> Any:
        return await self._guard_listing("list", "prompts/list", context, call_next)


class MountedGate(GateHooks):
    """A mounted FlowServer's gate, run in the parent server's middleware chain.

    A request is this server's when the component its name resolves to on the parent
    (with every parent transform applied) carries this server's owner mark.
    """

    def __init__(self, gate: SecurityGate) -> None:
        self.gate = gate

    async def on_request(self, context: MiddlewareContext, call_next: Any) -> Any:
        params = context.message
        if context.method == "prompts/get" and isinstance(params, Mapping) \
                and isinstance(params.get("name"), str):
            problem = malformed_prompt_request(params)
            if problem is not None:
                return await self._guard("prompt", params["name"], context,
                                         refuse_malformed(problem), call_next)
        if context.method == "completion/complete":
            from .security import _completion_target  # security imports this module

            return await self._guard_listing("completion", _completion_target(params),
                                             context, call_next)
        if context.method == "logging/setLevel":  # the parent's clients' level, for runs
            result = await call_next(context)
            await log_level.remember(context)
            return result
        return await call_next(context)

    async def _guard_listing(self, kind: RequestKind, name: str, context: MiddlewareContext,
                             call_next: Any) -> Any:
        return await self.gate._guard_listing(kind, name, context, call_next, mounted=True)

    async def _guard(self, kind: RequestKind, name: str, context: MiddlewareContext,
                     call_next: Any, otherwise: Any = None) -> Any:
        parent = context.fastmcp_context.fastmcp if context.fastmcp_context else None
        component = None if parent is None else await find_component(parent, kind, name)
        meta = owned_meta(component, self.gate.owner)
        if not self.gate.active or meta is None:
            # Not this FlowServer's component (the parent answers), or nothing to guard.
            return await (otherwise or call_next)(context)
        exposed = flow_of(self.gate.exposure, meta)

        async def resolved() -> ExposedFlow | None:
            return exposed

        admitted = ADMITTED_BY.set(self.gate)
        try:
            return await self.gate.guard_target(kind, name, resolved, context, call_next)
        finally:
            ADMITTED_BY.reset(admitted)


class MountedCompletions:
    """The completion handler of a parent server, covering its mounted FlowServers.

    A FastMCP server has one completion handler, and a parent knows nothing of its
    mounted servers' handlers: mount_into installs one of these per parent; it asks
    every FlowServer mounted there (under its namespace), then the parent's own handler.
    """

    def __init__(self, own: Callable[..., Any] | None) -> None:
        self.own = own  # the parent's handler before the first mount_into, if any
        self.mounted: list[tuple[str | None, Callable[..., Any]]] = []

    @classmethod
    def install(cls, parent: FastMCP, namespace: str | None,
                complete: Callable[..., Any]) -> None:
        """Answer ``parent``'s completions for a server mounted under ``namespace``."""
        current, _ = completion_handler(parent)
        # First mount, or the parent's handler was replaced since: keep it as its own.
        dispatcher = current if isinstance(current, MountedCompletions) else cls(current)
        dispatcher.mounted.append((namespace, complete))
        parent.add_completion_handler(dispatcher)

    async def __call__(self, ref: Any, argument: Any, context: Any = None) -> Any:
        for namespace, complete in self.mounted:
            local = _unprefixed(ref, namespace)
            if local is not None:
                # In a worker thread, like FastMCP runs a server's own sync handler.
                values = await anyio.to_thread.run_sync(complete, local, argument, context)
                if values:
                    return values
        if self.own is None:
            return None
        result = self.own(ref, argument, context)
        return await result if inspect.isawaitable(result) else result


def _unprefixed(ref: Any, namespace: str | None) -> Any:
    """``ref`` as the server mounted under ``namespace`` names it, or None."""
    if namespace is None:
        return ref
    if isinstance(ref, mcp_types.PromptReference):
        prefix = f"{namespace}_"
        if not ref.name.startswith(prefix):
            return None
        return ref.model_copy(update={"name": ref.name[len(prefix):]})
    protocol, separator, path = ref.uri.partition("://")
    if not separator or not path.startswith(f"{namespace}/"):
        return None
    return ref.model_copy(update={"uri": f"{protocol}://{path[len(namespace) + 1:]}"})
