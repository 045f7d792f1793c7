"""Following registry changes while serving: snapshots per request, and telling clients.

:class:`LiveMiddleware` runs first for every request: it pins the current exposure
snapshot for the whole request and remembers 2025-11-25 sessions. List handlers are
wrapped (:func:`paged_on_snapshot`) so a cursor carries the snapshot's sequence and
one from an older snapshot gets -32602 "list again". :class:`ChangeNotifier` learns
of each swap, waits ``debounce`` seconds so a burst becomes one message, diffs the
snapshot clients last heard about against the newest, and tells each client what
changed in its view: ``notifications/{tools,prompts,resources}/list_changed`` and
``notifications/resources/updated`` for subscribed schema resources. On 2026-07-28 it
serves ``subscriptions/listen`` (the MCP SDK's :class:`ListenHandler`, one bus per
stream); on 2025-11-25 it sends on each live session (stateful HTTP, stdio, memory).
Stateless HTTP has no channel back to the client: nothing is sent there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types
from fastmcp import FastMCP
from fastmcp.server.dependencies import get_context, get_http_request
from fastmcp.server.middleware import Middleware, MiddlewareContext
from mcp import MCPError
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .exposure import INDEX_URI, ExposedFlow, Exposure, LiveExposure
from .fastmcp_seams import forget_request_handler, low_level_server, on_connection_close

logger = logging.getLogger("chainweaver.mcp.notifications")

LIST_METHODS = frozenset({"tools/list", "resources/list", "resources/templates/list",
                          "prompts/list"})
LIST_AGAIN = ("the published list changed since this cursor was issued; "
              "list again from the start")


@dataclass(frozen=True)
class ViewChange:
    """What changed in one client's view between two snapshots."""

    tools: bool = False
    resources: bool = False
    prompts: bool = False
    updated: frozenset[str] = field(default_factory=frozenset)  # resource URIs

    def __bool__(self) -> bool:
        return self.tools or self.resources or self.prompts or bool(self.updated)


def _same_flow(a: ExposedFlow, b: ExposedFlow) -> bool:
    """Whether two exposed flows publish the same thing (names, version, contract)."""
    if a is b:
        return True
    fa, fb = a.flow, b.flow
    return (fa.version == fb.version and fa.title == fb.title
            and fa.description == fb.description and a.forced == b.forced
            and a.contract.input_schema == b.contract.input_schema
            and a.contract.output_schema == b.contract.output_schema
            and a.prompt_names == b.prompt_names
            and dict(a.authored_prompts) == dict(b.authored_prompts))


def _differs(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    if old.keys() != new.keys():
        return True
    return any(not _same_entry(old[key], new[key]) for key in new)


def _same_entry(a: Any, b: Any) -> bool:
    if isinstance(a, ExposedFlow):
        return _same_flow(a, b)
    if a.exposed_flow is None or b.exposed_flow is None:  # prompt entries
        return a.exposed_flow is b.exposed_flow and a.prompt is b.prompt
    return a.prompt == b.prompt and _same_flow(a.exposed_flow, b.exposed_flow)


def view_changes(old: Exposure, new: Exposure, subscriber: object) -> ViewChange:
    """What ``subscriber`` (a session) sees change from ``old`` to ``new``.

    Every subscriber sees the whole snapshot today; a per-caller view narrows both
    snapshots for ``subscriber`` here.
    """
    tools = _differs(old.tools, new.tools)
    resources = new.expose_schemas and old.resources.keys() != new.resources.keys()
    updated: set[str] = set()
    if new.expose_schemas:
        updated = {uri for uri, exposed in new.resources.items()
                   if uri in old.resources and not _same_flow(old.resources[uri], exposed)}
        if tools or resources or updated:
            updated.add(INDEX_URI)
    prompts = new.expose_prompts and _differs(old.prompts, new.prompts)
    return ViewChange(tools, resources, prompts, frozenset(updated))


@dataclass
class _Session:
    """A 2025-11-25 session to notify: its latest session object, its subscriptions."""

    session: ServerSession
    uris: set[str] = field(default_factory=set)


class ChangeNotifier:
    """Tells connected clients what changed after each snapshot swap (debounced)."""

    # Sessions are kept by id until their connection ends (or a send fails); the cap
    # bounds what sessions whose end is never reported could take.
    max_sessions = 10_000

    def __init__(self, live: LiveExposure, *, debounce: float = 0.05,
                 on_rebuilt: Callable[[Exposure], None] | None = None) -> None:
        """``on_rebuilt(snapshot)`` runs in a worker thread once a new snapshot's
        catalogue is built (the provider forgets components it no longer needs)."""
        self.live = live
        self.debounce = debounce
        self.on_rebuilt = on_rebuilt
        self._notified = live.latest  # the snapshot clients were last told about
        self._sessions: dict[str, _Session] = {}  # 2025-11-25, by session id
        # 2026-07-28 listen streams: bus -> its handler and the session it serves
        self._streams: dict[InMemorySubscriptionBus, tuple[ListenHandler, ServerSession]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.Task[None] | None = None

    # -------------------------------------------------------------- wiring

    def install(self, server: FastMCP, *, resources: bool) -> None:
        """Serve ``subscriptions/listen`` (and, with schema resources, subscribe), and
        make list cursors name the snapshot that issued them."""
        low = low_level_server(server)
        low.add_request_handler("subscriptions/listen",
                                mcp_types.SubscriptionsListenRequestParams, self._listen)
        if resources:
            low.add_request_handler("resources/subscribe",
                                    mcp_types.SubscribeRequestParams, self._subscribe)
            low.add_request_handler("resources/unsubscribe",
                                    mcp_types.UnsubscribeRequestParams, self._unsubscribe)
        for method in LIST_METHODS:
            entry = low.get_request_handler(method)
            if entry is not None:
                low.add_request_handler(method, entry.params_type,
                                        paged_on_snapshot(self.live, entry.handler))

    def without_back_channel(self, server: FastMCP) -> None:
        """Serving stateless HTTP: 2025-11-25 sessions cannot be notified, so do not
        advertise ``listChanged`` or ``resources.subscribe`` to them."""
        low_level_server(server).notification_options = NotificationOptions()
        for method in ("resources/subscribe", "resources/unsubscribe"):
            forget_request_handler(server, method)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While serving: changes are delivered on this event loop."""
        self._loop = asyncio.get_running_loop()
        self._notified = self.live.latest
        try:
            yield
        finally:
            self._loop = None
            for handler, _ in list(self._streams.values()):
                handler.close()
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None

    def remember(self, session_id: str, session: ServerSession) -> _Session:
        """Keep a 2025-11-25 session to notify (its newest session object) until its
        connection ends."""
        known = self._sessions.pop(session_id, None)
        if known is None:
            known = _Session(session)
            on_connection_close(session, lambda: self._forget(session_id))
            while len(self._sessions) >= self.max_sessions:
                del self._sessions[next(iter(self._sessions))]  # the least recent
        known.session = session
        self._sessions[session_id] = known  # most recent last
        return known

    def _forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    @property
    def listeners(self) -> int:
        """How many sessions and listen streams would be told of a change now."""
        return len(self._sessions) + len(self._streams)

    # ------------------------------------------------------- change -> clients

    def changed(self) -> None:
        """A new snapshot was swapped in (any thread): schedule one debounced notice."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._schedule)
        except RuntimeError:  # the loop closed in between
            pass

    def _schedule(self) -> None:
        if self._pending is None and self._loop is not None:
            self._pending = self._loop.create_task(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(self.debounce)
        self._pending = None  # a change from now on schedules another notice
        old, new = self._notified, self.live.latest
        if new is old:
            return
        sessions = list(self._sessions.items())
        streams = list(self._streams.items())

        def compare() -> tuple[list[ViewChange], list[ViewChange]]:
            # Deciding every flow and comparing views visit the catalogue: off the loop.
            # The new catalogue is built even with nobody to tell: lists need it, and
            # the next snapshot patches it.
            new.catalogue  # noqa: B018
            if self.on_rebuilt is not None:
                self.on_rebuilt(new)
            return ([view_changes(old, new, known.session) for _, known in sessions],
                    [view_changes(old, new, session) for _, (_, session) in streams])

        try:
            legacy, listening = await anyio.to_thread.run_sync(compare)
        except Exception:
            logger.exception("could not compare snapshots; clients are not told this time")
            return
        self._notified = new
        for (session_id, known), change in zip(sessions, legacy, strict=True):
            if change and not await _send_legacy(known, change):
                self._sessions.pop(session_id, None)
        for (bus, _), change in zip(streams, listening, strict=True):
            for event in _events(change):
                await bus.publish(event)

    # --------------------------------------------------------- request handlers

    async def _listen(self, ctx: Any, params: mcp_types.SubscriptionsListenRequestParams
                      ) -> mcp_types.SubscriptionsListenResult:
        bus = InMemorySubscriptionBus()
        handler = ListenHandler(bus)
        self._streams[bus] = (handler, ctx.session)
        try:
            result: mcp_types.SubscriptionsListenResult = await handler(ctx, params)
            return result
        finally:
            self._streams.pop(bus, None)

    async def _subscribe(self, ctx: Any, params: mcp_types.SubscribeRequestParams
                         ) -> mcp_types.EmptyResult:
        # Any URI may be subscribed to (a hidden one simply never fires): the answer
        # says nothing about what exists.
        known = self._current_session(ctx)
        if known is not None:
            known.uris.add(str(params.uri))
        return mcp_types.EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: mcp_types.UnsubscribeRequestParams
                           ) -> mcp_types.EmptyResult:
        known = self._current_session(ctx)
        if known is not None:
            known.uris.discard(str(params.uri))
        return mcp_types.EmptyResult()

    def _current_session(self, ctx: Any) -> _Session | None:
        session_id = notifiable_session_id()
        return None if session_id is None else self.remember(session_id, ctx.session)


async def _send_legacy(known: _Session, change: ViewChange) -> bool:
    session = known.session
    try:
        if change.tools:
            await session.send_tool_list_changed()
        if change.resources:
            await session.send_resource_list_changed()
        if change.prompts:
            await session.send_prompt_list_changed()
        for uri in sorted(change.updated & known.uris):
            await session.send_resource_updated(uri)
    except Exception:  # a closed session: forget it
        logger.debug("dropping a session that cannot be notified", exc_info=True)
        return False
    return True


def notifiable_session_id() -> str | None:
    """The current request's session id, when the server can notify that session.

    2025-11-25 only (2026-07-28 clients listen), and not over stateless HTTP, where
    a request carries no session and nothing can reach the client afterwards.
    """
    try:
        context = get_context()
        request = context.request_context
        if request is None or request.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        session_id = context.session_id
    except RuntimeError:
        return None
    try:
        http = get_http_request()
    except RuntimeError:
        return session_id  # stdio or in memory: one session per connection
    return session_id if http.headers.get("mcp-session-id") else None


def paged_on_snapshot(live: LiveExposure, handler: Callable[..., Awaitable[Any]]
                      ) -> Callable[..., Awaitable[Any]]:
    """Wrap a list handler: the request pins one snapshot, its cursors carry it.

    FastMCP numbers pages by offset, so a cursor from an older snapshot would mix two
    lists: such a cursor is refused with -32602 and the client lists again.
    """

    async def paged(ctx: Any, params: Any) -> Any:
        with live.pinned(ctx.session) as snapshot:
            if params is not None and params.cursor is not None:
                params = params.model_copy(
                    update={"cursor": _inner_cursor(params.cursor, snapshot.sequence)})
            result = await handler(ctx, params)
            if getattr(result, "next_cursor", None) is not None:
                result = result.model_copy(update={"next_cursor": _outer_cursor(
                    snapshot.sequence, result.next_cursor)})
            return result

    return paged


def _outer_cursor(sequence: int, inner: str) -> str:
    return f"{sequence}.{inner}"


def _inner_cursor(cursor: str, sequence: int) -> str:
    issued, dot, inner = cursor.partition(".")
    if not dot or not issued.isdigit():
        raise MCPError(code=mcp_types.INVALID_PARAMS, message="Invalid cursor")
    if int(issued) != sequence:
        raise MCPError(code=mcp_types.INVALID_PARAMS, message=LIST_AGAIN)
    return inner


def _events(change: ViewChange) -> list[ServerEvent]:
    events: list[ServerEvent] = []
    if change.tools:
        events.append(ToolsListChanged())
    if change.resources:
        events.append(ResourcesListChanged())
    if change.prompts:
        events.append(PromptsListChanged())
    events.extend(ResourceUpdated(uri=uri) for uri in sorted(change.updated))
    return events


class LiveMiddleware(Middleware):
    """First in the chain: one snapshot per request, and 2025-11-25 sessions kept."""

    def __init__(self, live: LiveExposure, notifier: ChangeNotifier) -> None:
        self.live = live
        self.notifier = notifier
        self.keep_alive: object = None  # what must live as long as this server serves

    async def on_message(self, context: MiddlewareContext, call_next: Any) -> Any:
        request = context.fastmcp_context.request_context if context.fastmcp_context \
            else None
        # The SDK builds one session object per request: it names the request.
        with self.live.pinned(request.session if request is not None else object()):
            session_id = notifiable_session_id() if request is not None else None
            if request is not None and session_id is not None:
                self.notifier.remember(session_id, request.session)
            return await call_next(context)
