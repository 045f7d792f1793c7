"""Following registry changes while serving: snapshots per request, and telling clients.

:class:`SnapshotPins` is the first step of every request (the gate takes it): it pins
the current exposure snapshot for the whole request and remembers 2025-11-25
sessions. List handlers are wrapped (:func:`.cursors.paged_by_view`) so a cursor
belongs to the caller's view of the list it was cut from. :class:`ChangeNotifier` learns
of each swap, waits ``debounce`` seconds so a burst becomes one message, diffs the
snapshot clients last heard about against the newest (:mod:`.view_changes`), and tells
each client what changed in its view: ``notifications/{tools,prompts,resources}/list_changed`` and
``notifications/resources/updated`` for subscribed schema resources. On 2026-07-28 it
serves ``subscriptions/listen`` (the MCP SDK's :class:`ListenHandler`, one bus per
stream); on 2025-11-25 it sends on each live session (stateful HTTP, stdio, memory).
Stateless HTTP has no channel back to the client: nothing is sent there. A resource
is named as the server's clients list it: through the transforms on the server (a
``Namespace("shop")`` sends ``chainweaver://shop/flows/x/schema`` and
``chainweaver://shop/runs/<id>``; see :func:`.composition.published_uris`).

With a view rule (``SecurityConfig(visible=...)``) each listener is told only what changed
in *its caller's* view: both snapshots are narrowed to that view before they are
compared. A listen stream follows the caller the gate admitted for the
``subscriptions/listen`` request; a 2025-11-25 session follows the caller the gate
last admitted on it (the request's admission tells it), or, without an
``authenticator``, the caller of the verified bearer token. A session no caller was
admitted on yet is told nothing. An ``authenticator`` (its answer may change) is asked
again, with the request context it admitted the caller from, before anything is sent.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeGuard

import anyio
import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.server.dependencies import get_context, get_http_request
from fastmcp.server.middleware import MiddlewareContext
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

from chainweaver.mcp.fastmcp_seams import (
    advertise_no_notifications,
    forget_request_handler,
    low_level_server,
    on_connection_close,
)
from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.admission import (
    Admission,
    caller_from_token,
    pinned,
    token_expiry,
)
from chainweaver.mcp.gate.composition import published_uris
from chainweaver.mcp.gate.security import refusal_error
from chainweaver.mcp.gate.views import View, Views
from chainweaver.mcp.hooks import CallerIdentity, GateContext
from chainweaver.mcp.live.cursors import paged_by_view
from chainweaver.mcp.live.listeners import Session, Stream
from chainweaver.mcp.live.view_changes import NOTHING, ViewChange, view_changes
from chainweaver.mcp.publish.exposure import Exposure
from chainweaver.mcp.publish.live_exposure import LiveExposure

logger = logging.getLogger("chainweaver.mcp.live.notifications")

# Authenticator calls in flight at once when listeners' callers are asked again.
MAX_ASKING = 16
# The gate's authenticator: the caller a request context names (raises to refuse).
Authenticate = Callable[[GateContext], Coroutine[Any, Any, CallerIdentity]]
LIST_METHODS = frozenset({"tools/list", "resources/list", "resources/templates/list",
                          "prompts/list"})


class ChangeNotifier:
    """Tells connected clients what changed after each snapshot swap (debounced)."""

    # Sessions are kept by id until their connection ends (or a send fails); the cap
    # bounds what sessions whose end is never reported could take.
    max_sessions = 10_000

    def __init__(self, live: LiveExposure, *, debounce: float = 0.05,
                 on_rebuilt: Callable[[Exposure], None] | None = None,
                 views: Views | None = None, callers_from_token: bool = True,
                 authenticate: Authenticate | None = None, max_streams: int = 10_000,
                 max_streams_per_caller: int = 100) -> None:
        """``on_rebuilt(snapshot)`` runs in a worker thread once a new snapshot's
        catalogue is built (the provider forgets components it no longer needs).
        ``views``: the server's per-caller views. ``callers_from_token``: no
        ``authenticator`` decides callers, the verified bearer token does;
        ``authenticate``: the gate's authenticator otherwise (see :meth:`caller_now`).
        ``max_streams`` / ``max_streams_per_caller``: open listen streams at once,
        server-wide and per caller id (anonymous callers are one caller); each is a task
        and a buffer until its client goes, so one over a cap is refused (-32001), never
        queued."""
        self.max_streams = max_streams
        self.max_streams_per_caller = max_streams_per_caller
        self.live = live
        self.debounce = debounce
        self.on_rebuilt = on_rebuilt
        self.views = views or Views(None)
        self.callers_from_token = callers_from_token
        self._notified = live.latest  # the snapshot clients were last told about
        self._sessions: dict[str, Session] = {}  # 2025-11-25, by session id
        self._streams: dict[InMemorySubscriptionBus, Stream] = {}  # 2026-07-28, by bus
        self._streams_of: Counter[str | None] = Counter()  # open streams by caller id
        self.authenticate = authenticate
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.Task[None] | None = None
        self._telling: set[asyncio.Task[None]] = set()  # runs' changes being told
        self._server: FastMCP | None = None  # whose transforms name what clients list

    # -------------------------------------------------------------- wiring

    def install(self, server: FastMCP, *, resources: bool, page_size: int | None = None,
                provider: object = None) -> None:
        """Serve ``subscriptions/listen`` (and, with schema resources, subscribe), and
        serve lists by page of the caller's list (:mod:`.cursors`; ``provider``, the
        flow provider, cuts the pages)."""
        self._server = server
        low = low_level_server(server)
        if low is None:
            return  # warned: no listen stream, no subscriptions, cursors by FastMCP
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
                low.add_request_handler(method, entry.params_type, paged_by_view(
                    entry.handler, server, method, page_size, provider))

    def without_back_channel(self, server: FastMCP) -> None:
        """Serving stateless HTTP: 2025-11-25 sessions cannot be notified, so do not
        advertise ``listChanged`` or ``resources.subscribe`` to them."""
        advertise_no_notifications(server)
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
            for stream in list(self._streams.values()):
                stream.handler.close()
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None
            for telling in list(self._telling):
                telling.cancel()

    def remember(self, session_id: str, session: ServerSession) -> Session:
        """Keep a 2025-11-25 session to notify (its newest session object) until its
        connection ends."""
        known = self._sessions.pop(session_id, None)
        if known is None:
            known = Session(session)
            on_connection_close(session, lambda: self._forget(session_id))
            while len(self._sessions) >= self.max_sessions:
                del self._sessions[next(iter(self._sessions))]  # the least recent
        else:
            known.came_on(session)
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
            # In a context of its own: the change may come from inside a request (a
            # tool that changes the registry), and nothing a notice does, asking the
            # authenticator again above all, may read that request's caller.
            self._pending = self._loop.create_task(self._flush(),
                                                   context=contextvars.Context())

    async def _flush(self) -> None:
        # One notice at a time (a change while one is told, its listeners asked about
        # again, is told after it): two at once would ask every listener twice and
        # could tell an older snapshot last.
        try:
            while await self._notify_after_debounce():
                pass
        finally:
            if self._pending is asyncio.current_task():
                self._pending = None

    async def _notify_after_debounce(self) -> bool:
        """Tell clients what changed since the snapshot they last heard of; False:
        nothing changed (or the snapshots could not be compared)."""
        await asyncio.sleep(self.debounce)
        old, new = self._notified, self.live.latest
        if new is old:
            return False
        sessions = list(self._sessions.items())
        streams = list(self._streams.items())
        held = [(known.caller_now(), known.gate) for _, known in sessions]
        held.extend((stream.caller_now(), stream.gate) for _, stream in streams)
        callers: list[CallerIdentity | None] = [caller for caller, _ in held]
        if self.authenticate is not None:
            # Each listener's caller as the authenticator answers now, not as it did
            # when the listener was admitted (a few hooks at a time).
            asking = asyncio.Semaphore(MAX_ASKING)

            async def now(caller: CallerIdentity | None, gate: GateContext | None
                          ) -> CallerIdentity | None:
                async with asking:
                    return await self.caller_now(caller, gate)

            callers = list(await asyncio.gather(*(now(c, g) for c, g in held)))

        def compare() -> tuple[list[ViewChange], list[ViewChange]]:
            # Deciding every flow and comparing views visit the catalogue: off the loop.
            # The new catalogue is built even with nobody to tell: lists need it, and
            # the next snapshot patches it.
            new.catalogue  # noqa: B018
            if self.on_rebuilt is not None:
                self.on_rebuilt(new)
            changes = self._changes(old, new, callers)
            return changes[:len(sessions)], changes[len(sessions):]

        try:
            legacy, listening = await anyio.to_thread.run_sync(compare)
        except Exception:
            logger.exception("could not compare snapshots; clients are not told this time")
            return False
        self._notified = new
        # Named as clients list them (once per distinct change: views share theirs).
        listed = {change: await self._as_listed(change) for change in {*legacy, *listening}}
        for (session_id, known), change in zip(sessions, legacy, strict=True):
            if change and not await _send_legacy(known, listed[change]):
                self._sessions.pop(session_id, None)
        for (bus, _), change in zip(streams, listening, strict=True):
            for event in _events(listed[change]):
                await bus.publish(event)
        return True

    async def _as_listed(self, change: ViewChange) -> ViewChange:
        """``change`` with its URIs as the server's clients list them."""
        if not change.updated:
            return change
        return dataclasses.replace(change, updated=frozenset(
            (await self._listed_uris(sorted(change.updated))).values()))

    async def _listed_uris(self, uris: list[str]) -> dict[str, str]:
        transforms = self._server.transforms if self._server is not None else ()
        return await published_uris(transforms, uris)

    def _changes(self, old: Exposure, new: Exposure,
                 callers: list[CallerIdentity | None]) -> list[ViewChange]:
        """What each caller's view shows changing (a caller not known: nothing)."""
        if not (self.views.per_caller(old) or self.views.per_caller(new)):
            # One view for everybody: compare once.
            change = view_changes(old, new) if any(c is not None for c in callers) \
                else NOTHING
            return [NOTHING if caller is None else change for caller in callers]
        # Callers of one grant set share a view of each snapshot: compared once.
        compared: dict[tuple[int, int], tuple[View, View, ViewChange]] = {}
        changes: list[ViewChange] = []
        for caller in callers:
            if caller is None:
                changes.append(NOTHING)
                continue
            old_view, new_view = self.views.of(old, caller), self.views.of(new, caller)
            key = (id(old_view), id(new_view))
            if key not in compared:  # (the views are held, so their ids stay theirs)
                compared[key] = (old_view, new_view,
                                 view_changes(old, new, old_view, new_view))
            changes.append(compared[key][2])
        return changes

    async def caller_now(self, caller: CallerIdentity | None, gate: GateContext | None
                         ) -> CallerIdentity | None:
        """``caller``, admitted from ``gate``, as the authenticator answers now (None:
        it refuses; without an authenticator, ``caller`` itself)."""
        if caller is None or gate is None or self.authenticate is None:
            return caller
        try:
            # In no request's context (a run's status is told from inside its call):
            # the hook names the caller from ``gate`` alone.
            return await asyncio.create_task(self.authenticate(gate),
                                             context=contextvars.Context())
        except Exception:  # GateRefused, or anything else: tell this listener nothing
            return None

    def admitted_caller(self) -> CallerIdentity | None:
        """The caller of the request being served, as notifications follow it: the one
        the gate admitted, else (no ``authenticator``) the verified token's."""
        held = admission.current()
        caller = held.caller if held is not None else None
        if caller is None and self.callers_from_token:
            caller = caller_from_token()
        return caller

    async def run_updated(self, caller_id: str, flow_name: str, uris: list[str]) -> None:
        """A run's status changed: tell the sessions and listen streams of the caller
        that started it, while its flow is in their view, that ``uris`` (the run's and
        the listing's) were updated. Nobody else hears of it."""
        sessions = [(session_id, known) for session_id, known in self._sessions.items()
                    if _is(known.caller_now(), caller_id)]
        streams = [(bus, stream) for bus, stream in self._streams.items()
                   if _is(stream.caller_now(), caller_id)]
        if not (sessions or streams):
            return  # the common case, at every run's start and end (inside its call)
        # Told beside the run, not inside its call: an authenticator asked again about
        # each listener may take up to its hook_timeout.
        telling = asyncio.get_running_loop().create_task(
            self._tell_run_updated(caller_id, flow_name, uris, sessions, streams),
            context=contextvars.Context())
        self._telling.add(telling)
        telling.add_done_callback(self._told)

    def _told(self, telling: asyncio.Task[None]) -> None:
        self._telling.discard(telling)
        if not telling.cancelled() and telling.exception() is not None:
            logger.error("could not tell a run's listeners that it changed",
                         exc_info=telling.exception())

    async def _tell_run_updated(self, caller_id: str, flow_name: str, uris: list[str],
                                sessions: list[tuple[str, Session]],
                                streams: list[tuple[InMemorySubscriptionBus, Stream]]
                                ) -> None:
        latest = self.live.latest
        exposed = latest.flow(flow_name)

        async def sees(caller: CallerIdentity | None, gate: GateContext | None) -> bool:
            now = await self.caller_now(caller, gate)
            return _is(now, caller_id) and self.views.of(latest, now).allows(exposed)

        listed: dict[str, str] = {}  # as clients list them, once someone is told
        for session_id, known in sessions:
            if not await sees(known.caller_now(), known.gate):
                continue
            listed = listed or await self._listed_uris(uris)
            if not await _send_legacy(known, ViewChange(updated=frozenset(listed.values()))):
                self._sessions.pop(session_id, None)
        for bus, stream in streams:
            if await sees(stream.caller_now(), stream.gate):
                listed = listed or await self._listed_uris(uris)
                for uri in listed.values():
                    await bus.publish(ResourceUpdated(uri=uri))

    # --------------------------------------------------------- request handlers

    async def _listen(self, ctx: Any, params: mcp_types.SubscriptionsListenRequestParams
                      ) -> mcp_types.SubscriptionsListenResult:
        # The gate admitted this request (it is gated like a list): the stream is told
        # what changes in that caller's view, for as long as it stays open (under an
        # authenticator: as it answers then, asked with this request's context again).
        caller = self.admitted_caller()
        held = admission.current()
        key = caller.id if caller is not None else None
        # Checked and taken with no await in between: concurrent listens cannot pass
        # the caps together. The gate audits the refusal as a denial.
        if len(self._streams) >= self.max_streams:
            raise refusal_error("listen_streams_full")
        if self._streams_of[key] >= self.max_streams_per_caller:
            raise refusal_error("too_many_listen_streams")
        bus = InMemorySubscriptionBus()
        handler = ListenHandler(bus)
        expires = token_expiry()
        self._streams[bus] = Stream(handler, caller,
                                     held.asked if held is not None else None, expires)
        self._streams_of[key] += 1
        ending = None
        try:
            # The stream ends (gracefully: its result is the last frame) when the token
            # it was opened with expires; the client listens again with a new one.
            if expires is not None:
                ending = asyncio.get_running_loop().call_later(
                    max(0.0, expires - time.time()), handler.close)
            result: mcp_types.SubscriptionsListenResult = await handler(ctx, params)
            return result
        finally:
            if ending is not None:
                ending.cancel()
            self._streams.pop(bus, None)
            self._streams_of[key] -= 1
            if not self._streams_of[key]:
                del self._streams_of[key]

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

    def _current_session(self, ctx: Any) -> Session | None:
        session_id = notifiable_session_id()
        return None if session_id is None else self.remember(session_id, ctx.session)


async def _send_legacy(known: Session, change: ViewChange) -> bool:
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


def notifiable_session_id(context: Context | None = None) -> str | None:
    """The current request's session id, when the server can notify that session
    (``context``: the request's FastMCP context, when the caller has it at hand).

    2025-11-25 only (2026-07-28 clients listen), and not over stateless HTTP, where
    a request carries no session and nothing can reach the client afterwards.
    """
    try:
        context = context or get_context()
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


def _is(caller: CallerIdentity | None, caller_id: str) -> TypeGuard[CallerIdentity]:
    return caller is not None and caller.id == caller_id


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


class SnapshotPins:
    """The first step of every request (the gate takes it before anything else; see
    :mod:`chainweaver.mcp.gate.front_door`): one snapshot per request,
    and 2025-11-25 sessions kept, each with the caller it follows."""

    def __init__(self, live: LiveExposure, notifier: ChangeNotifier,
                 keep_alive: object = None) -> None:
        self.live = live
        self.notifier = notifier
        self.keep_alive = keep_alive  # what must live as long as this server serves

    def pin(self, context: MiddlewareContext) -> Admission | None:
        """The request's first admission, this server's snapshot pinned in it (None:
        the request pinned it already)."""
        request = context.fastmcp_context.request_context if context.fastmcp_context \
            else None
        # The SDK builds one session object per request: it names the request.
        name = request.session if request is not None else object()
        session_id = notifiable_session_id(context.fastmcp_context) \
            if request is not None else None
        learn = None
        if request is not None and session_id is not None:
            known = self.notifier.remember(session_id, request.session)
            if self.notifier.callers_from_token:
                known.follow_token()
            else:
                learn = known.admit  # an authenticator decides: the gate tells the record
        return pinned(name, self.live, learn)
