"""Mounting a FlowServer into another FastMCP server (:meth:`FlowServer.mount_into`).

:class:`MountedGate` runs the server's security gate in the parent's middleware chain,
so a refusal keeps its JSON-RPC shape, and every request for the server, run reads
and the parent's subscription requests included, is admitted exactly as when it
stands alone; :class:`MountedCompletions` answers the parent's completions for every
FlowServer mounted there, then the parent's own handler. (The parent's subscriptions
are served by :mod:`chainweaver.mcp.live.subscriptions`.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import mcp_types
from fastmcp import FastMCP
from fastmcp.server.dependencies import get_http_headers
from fastmcp.server.middleware import MiddlewareContext

from chainweaver.mcp.fastmcp_seams import completion_handler
from chainweaver.mcp.gate import admission, log_level
from chainweaver.mcp.gate.admission import Admission, caller_from_token
from chainweaver.mcp.gate.composition import (
    Route,
    find_component,
    flow_of,
    owned_by_another,
    owned_meta,
)
from chainweaver.mcp.gate.front_door import FrontDoor
from chainweaver.mcp.gate.malformed import malformed_prompt_request, refuse_malformed
from chainweaver.mcp.gate.requests import completion_target, gate_for
from chainweaver.mcp.gate.security import (
    LOG_LEVEL_METHOD,
    SUBSCRIPTION_METHODS,
    GateRefused,
    SecurityGate,
)
from chainweaver.mcp.hooks import CallerIdentity, RequestKind
from chainweaver.mcp.publish.exposure import ExposedFlow
from chainweaver.mcp.publish.run_uris import RUNS_URI, is_run_uri


class MountedGate(FrontDoor):
    """A mounted FlowServer's gate, run in the parent server's middleware chain.

    A request is this server's when the component its name resolves to on the parent
    (with every parent transform applied) carries this server's owner mark, or when it
    reads a URI where the parent's clients reach this server's run resources and no
    other FlowServer's resource answers it: a run read is admitted as one whatever run
    it names, so another caller's run answers exactly like one that never existed.
    ``route``: how the parent's clients reach the mounted server.
    """

    def __init__(self, gate: SecurityGate, route: Route) -> None:
        self.gate = gate
        self.pins = gate.pins  # the mounted server's snapshot, pinned in the parent's chain
        self.route = route

    async def on_request(self, context: MiddlewareContext, call_next: Any) -> Any:
        params = context.message
        if context.method == "prompts/get" and isinstance(params, Mapping) \
                and isinstance(params.get("name"), str):
            problem = malformed_prompt_request(params)
            if problem is not None:
                return await self.guard("prompt", params["name"], context,
                                         refuse_malformed(problem), call_next)
        if context.method == "completion/complete":
            return await self.guard_listing("completion", completion_target(params),
                                             context, call_next)
        if context.method in SUBSCRIPTION_METHODS:
            # Served by the parent for every FlowServer mounted there (and itself):
            # each gate admits it, and its notifier follows the caller it admitted.
            # The mounted server's own chain never sees it: counted here.
            return await self.gate.guard_listing("subscription", context.method, context,
                                                 call_next, mounted=True, count=True)
        if context.method == LOG_LEVEL_METHOD:  # the parent's clients' level, for runs
            return await self.guard_listing("subscription", LOG_LEVEL_METHOD, context,
                                             log_level.setting(call_next,
                                                               self.gate.keeps_sessions))
        return await call_next(context)

    async def guard_listing(self, kind: RequestKind, name: str, context: MiddlewareContext,
                             call_next: Any) -> Any:
        return await self.gate.guard_listing(kind, name, context, call_next, mounted=True)

    async def guard(self, kind: RequestKind, name: str, context: MiddlewareContext,
                     call_next: Any, otherwise: Any = None) -> Any:
        parent = context.fastmcp_context.fastmcp if context.fastmcp_context else None
        if parent is None:
            return await (otherwise or call_next)(context)  # nothing to guard
        # Whose request is it? Only a component this caller may see can be this
        # server's: the caller is authenticated first (nothing audited yet), and the
        # name resolved in its view. A flow hidden from it is then, like a name that
        # never existed, the parent's to answer. A run read is this server's whatever
        # run it names, unless another FlowServer's run answers it.
        held = admission.current()
        caller = await self._caller_for(kind, name)
        probe = self._probe(caller, kind, name)
        with admission.admitted(probe):
            component = await find_component(parent, kind, name)
        meta = owned_meta(component, self.gate.owner)
        root = RUNS_URI if kind == "prompt" else await self.route.runs_root()
        run_read = kind == "resource" and is_run_uri(name, root) \
            and not owned_by_another(component, self.gate.owner)
        if meta is None and not run_read:
            # Not this server's, for this caller: served as the gate decided, so no
            # later lookup finds a flow of this server under the name either; and as
            # the gate that admitted it before (a FlowServer parent's own flow) keeps
            # it: its caller and run are never this gate's.
            with admission.admitted(admission.beside(held, probe.reaching_none())):
                return await (otherwise or call_next)(context)
        exposed = flow_of(self.gate.exposure, meta) if meta is not None else None

        async def resolved() -> ExposedFlow | None:
            return exposed

        # A run read no resource of this server answers (an unknown id, another
        # caller's run) never reaches this server's own chain, which counts what it
        # serves: counted here, as when it stands alone.
        return await self.gate.guard_target(kind, name, resolved, context, call_next,
                                            authenticated=caller,
                                            mounted=meta is not None, runs_root=root)

    async def _caller_for(self, kind: RequestKind, name: str) -> CallerIdentity | None:
        """The caller the gate would admit the request as (None: it would refuse it);
        nothing is audited: this only asks whether the request is this server's."""
        gate = gate_for(kind, name, None, get_http_headers(include_all=True))
        try:
            return await self.gate.authenticate(gate)
        except GateRefused:
            return None

    def _probe(self, caller: CallerIdentity | None, kind: RequestKind, name: str
               ) -> Admission:
        """An undecided admission of ``caller``'s request (the token's caller when
        None), for looking its name up in that caller's view."""
        return self.gate.undecided(caller or caller_from_token(), kind, name)


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
