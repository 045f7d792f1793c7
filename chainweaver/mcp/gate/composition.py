"""Keeping the security gate in charge when FastMCP composition renames or mounts.

Two compositions are supported:

- A transform added to ``server.fastmcp`` (a ``Namespace``, a ``ToolTransform``
  rename): the gate finds the component a renamed request resolves to and reads
  its flow from the metadata every flow component carries.
- Mounting with :meth:`FlowServer.mount_into`: a ``MountedGate``
  (:mod:`.mounting`) runs this server's gate in the parent's middleware chain, so a
  refusal keeps its JSON-RPC shape (a parent turns exceptions raised under a mounted
  tool into ``isError`` results and logs them with a traceback).

Both find "their" components by the owner mark every component of a FlowServer
carries in ``_meta.chainweaver.server``, whatever name transforms gave it, and both
know where their clients reach the run resources (:func:`runs_root`): every URI
there is a run read, admitted as one whatever run it names, and a large output's link
is written there. Change notifications name resources as the clients list them
(:func:`published_uris`), and the server card names what the lists name
(:func:`listed_through`).

Anything else that routes a request into the server without its own transport
(a bare ``FastMCP.mount()``) is refused, loudly, by the gate itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from fastmcp import FastMCP
from fastmcp.prompts import Prompt
from fastmcp.resources import Resource, ResourceTemplate, TextResource
from fastmcp.server.middleware import MiddlewareContext
from fastmcp.server.transforms import Namespace, Transform
from fastmcp.server.transforms.visibility import is_enabled
from fastmcp.tools import Tool
from pydantic import AnyUrl

from chainweaver.mcp.hooks import RequestKind
from chainweaver.mcp.publish.exposure import ExposedFlow, Exposure
from chainweaver.mcp.publish.run_uris import RUNS_URI

# Key of the gate in the lifespan state of the FastMCP server a FlowServer builds.
GATE_STATE_KEY = "chainweaver_security_gate"


def gate_lifespan(gate: object) -> Callable[[FastMCP], AbstractAsyncContextManager[
        dict[str, Any]]]:
    """A FastMCP lifespan that records ``gate`` in the server's lifespan state.

    Every request a server's own transport receives carries that state; a request a
    parent server delegates through ``FastMCP.mount()`` carries the parent's.
    """

    @asynccontextmanager
    async def lifespan(server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        yield {GATE_STATE_KEY: gate}

    return lifespan


def reached_directly(gate: object, context: MiddlewareContext) -> bool:
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


def owned_by_another(component: Any, owner: str) -> bool:
    """Whether another FlowServer than ``owner``'s published the component."""
    meta = (getattr(component, "meta", None) or {}).get("chainweaver")
    return isinstance(meta, Mapping) and meta.get("server") not in (None, owner)


def flow_of(exposure: Exposure, meta: Mapping[str, Any]) -> ExposedFlow | None:
    """The exposed flow a component's metadata names (None: the index, the guide...);
    for a run resource, its run's flow as exposed now (``run_flow``: a run of an
    older version reads while its flow is in the caller's view)."""
    run_flow = meta.get("run_flow")
    if isinstance(run_flow, str):
        return exposure.flow(run_flow)
    flow_name = meta.get("flow")
    exposed = exposure.flow(flow_name) if isinstance(flow_name, str) else None
    if exposed is None or exposed.flow.version != meta.get("version"):
        return None
    return exposed


# Where clients reach chainweaver://runs, per chain of transforms (the transforms
# themselves kept, so an id is never reused while its entry stands); a few chains per
# server, so the oldest is dropped past a bound only a misuse would reach.
_ROOTS: dict[tuple[int, ...], tuple[tuple[Transform, ...], str]] = {}
MAX_ROOTS = 256


async def runs_root(transforms: Sequence[Transform]) -> str:
    """Where clients reach ``chainweaver://runs`` through ``transforms``, applied in
    the order FastMCP lists a resource through them (a ``Namespace("shop")`` gives
    ``chainweaver://shop/runs``); the server's own root when they publish none.

    Worked out with the transforms' own listing, once per chain of transforms.
    """
    if not transforms:
        return RUNS_URI
    key = tuple(id(transform) for transform in transforms)
    known = _ROOTS.get(key)
    if known is not None:
        return known[1]
    listed: Sequence[Resource] = [TextResource(uri=AnyUrl(RUNS_URI),
                                               name="chainweaver_runs", text="")]
    for transform in transforms:
        listed = await transform.list_resources(listed)
    root = str(listed[0].uri) if len(listed) == 1 else RUNS_URI
    if len(_ROOTS) >= MAX_ROOTS:
        _ROOTS.pop(next(iter(_ROOTS)))
    _ROOTS[key] = (tuple(transforms), root)
    return root


async def published_uris(transforms: Sequence[Transform], uris: Sequence[str]
                         ) -> dict[str, str]:
    """Each of ``uris`` (this server's own) as clients list it through ``transforms``
    (``chainweaver://flows/x/schema`` -> ``chainweaver://shop/flows/x/schema`` under
    a ``Namespace("shop")``); a URI the transforms hide is left out.

    Worked out with the transforms' own listing, as :func:`runs_root` is.
    """
    if not transforms:
        return {uri: uri for uri in uris}
    # Each stand-in is named by its position: a transform moves URIs, not names.
    listed: Sequence[Resource] = [TextResource(uri=AnyUrl(uri), name=str(index), text="")
                                  for index, uri in enumerate(uris)]
    for transform in transforms:
        listed = await transform.list_resources(listed)
    named: dict[str, str] = {}
    for resource in _enabled(listed):
        if resource.name.isdigit() and int(resource.name) < len(uris):
            named[uris[int(resource.name)]] = str(resource.uri)
    return named


@dataclass(frozen=True, eq=False)
class Route:
    """How the clients of one FastMCP server reach a FlowServer's components: its own
    ``server`` directly (``parent`` None), or mounted into ``parent`` with
    ``mount_into`` (``mount``: the namespace it was given, as a transform).
    Transforms are read when asked, so one added later, on either server, counts."""

    server: FastMCP  # the FlowServer's own FastMCP
    parent: FastMCP | None = None
    mount: tuple[Transform, ...] = ()

    @classmethod
    def mounted(cls, server: FastMCP, parent: FastMCP, namespace: str | None) -> Route:
        return cls(server, parent, (Namespace(namespace),) if namespace else ())

    def transforms(self) -> list[Transform]:
        """The transforms a resource passes on its way to these clients, in the order
        FastMCP lists it through them: the server's own, the mount's namespace, then
        the parent's."""
        parent = self.parent.transforms if self.parent is not None else ()
        return [*self.server.transforms, *self.mount, *parent]

    async def uris(self, uris: Sequence[str]) -> dict[str, str]:
        """Each of ``uris`` (the server's own) as these clients list it; a URI hidden
        on the way is left out (:func:`published_uris`)."""
        return await published_uris(self.transforms(), uris)

    async def runs_root(self) -> str:
        """Where these clients reach the server's run resources (:func:`runs_root`)."""
        return await runs_root(self.transforms())


ComponentT = TypeVar("ComponentT", Tool, Resource, ResourceTemplate, Prompt)
Listed = tuple[Sequence[Tool], Sequence[Resource], Sequence[ResourceTemplate],
               Sequence[Prompt]]


def listed_through(transforms: Sequence[Transform], listed: Listed) -> Listed:
    """``listed`` (a server's tools, resources, templates and prompts) as its lists
    show them through ``transforms`` (renamed, moved, added, hidden), for a document
    built outside a request (the server card).

    A transform's listing is async by API but works on what it is given: it runs to
    its end on a loop of its own, in a thread, since the caller may be on one.
    """
    tools, resources, templates, prompts = listed

    async def through() -> Listed:
        nonlocal tools, resources, templates, prompts
        for transform in transforms:
            tools = await transform.list_tools(tools)
            resources = await transform.list_resources(resources)
            templates = await transform.list_resource_templates(templates)
            prompts = await transform.list_prompts(prompts)
        return _enabled(tools), _enabled(resources), _enabled(templates), _enabled(prompts)

    with ThreadPoolExecutor(1, thread_name_prefix="chainweaver-card") as pool:
        return pool.submit(asyncio.run, through()).result()


def _enabled(listed: Sequence[ComponentT]) -> list[ComponentT]:
    """What a list shows of ``listed``: a visibility transform (``server.disable()``)
    only marks the components it hides, and the server leaves them out at the end."""
    return [component for component in listed if is_enabled(component)]
