"""Following registry changes while serving: snapshots per request, and telling clients.

:class:`SnapshotPins` is the first step of every request (the gate takes it): it pins
the current exposure snapshot for the whole request and remembers 2025-11-25
sessions. List handlers are wrapped (:func:`.cursors.paged_by_view`) so a cursor
belongs to the caller's view of the list it was cut from. :class:`ChangeNotifier` learns
of each swap, waits ``debounce`` seconds so a burst becomes one message, diffs the
snapshot clients last heard about against the newest (:mod:`.view_changes`), and tells
each client what changed in its view: ``notifications/{tools,prompts,resources}/list_changed`` and
``notifications/resources/updated`` for subscribed schema resources. On 2026-07-28 it
publishes to each ``subscriptions/listen`` stream it follows (one bus per stream; the
requests are served by :mod:`.subscriptions`, on the server and on every parent it
is mounted into); on 2025-11-25 it sends on each live session (stateful HTTP, stdio,
memory); :mod:`.listeners` holds the records of both. Stateless HTTP has no channel
back to the client: nothing is sent there. A resource is named as the listener's
client lists it, through the listener's
:class:`~chainweaver.mcp.gate.composition.Route`: the transforms on the server (a
``Namespace("shop")`` sends ``chainweaver://shop/flows/x/schema`` and
``chainweaver://shop/runs/<id>``), then, for a client of a parent it is mounted into
with ``mount_into``, the mount's namespace and the parent's transforms.

With a view rule (``SecurityConfig(visible=...)``) each listener is told only what changed
in *its caller's* view: both snapshots are narrowed to that view before they are
compared. A listen stream follows the caller the gate admitted for the
``subscriptions/listen`` request; a 2025-11-25 session follows the caller the gate
last admitted on it (the request's admission tells it), or, without an
``authenticator``, the caller of the verified bearer token. A session no caller was
admitted on yet is told nothing. An ``authenticator`` (its answer may change) is asked
again, with the request context it admitted the caller from, before anything is sent,
in no request's context (a change made inside one caller's request never has another
listener asked about as that caller). A listener whose bearer token expired (its
``exp``, by the wall clock) is told nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeGuard

import anyio
from fastmcp import FastMCP
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
)
from chainweaver.mcp.gate.composition import Route
from chainweaver.mcp.gate.views import View, Views
from chainweaver.mcp.hooks import CallerIdentity, GateContext
from chainweaver.mcp.live.cursors import paged_by_view
from chainweaver.mcp.live.listeners import (
    Session,
    Stream,
    notifiable_session_id,
    send_legacy,
)
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
                 max_streams_per_caller: int = 100, owner: str = "") -> None:
        """``on_rebuilt(snapshot)`` runs in a worker thread once a new snapshot's
        catalogue is built (the provider forgets components it no longer needs).
        ``views``: the server's per-caller views. ``callers_from_token``: no
        ``authenticator`` decides callers, the verified bearer token does;
        ``authenticate``: the gate's authenticator otherwise (see :meth:`caller_now`).
        ``max_streams`` / ``max_streams_per_caller``: open listen streams at once,
        server-wide and per caller id (anonymous callers are one caller); each is a task
        and a buffer until its client goes, so one over a cap is refused (-32001), never
        queued. ``owner``: the owner mark of the server's gate, whose admission a
        listener follows."""
        self.max_streams = max_streams
        self.max_streams_per_caller = max_streams_per_caller
        self.live = live
        self.owner = owner
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
        self.route: Route | None = None  # how the server's own clients name resources

    # -------------------------------------------------------------- wiring

    def install(self, route: Route, *, page_size: int | None = None,
                provider: object = None) -> None:
        """Serve the server's lists by page of the caller's list (:mod:`.cursors`;
        ``provider``, the flow provider, cuts the pages); ``route`` (the server's own)
        names what its own clients are told. (Its subscription requests:
        :mod:`.subscriptions`.)"""
        self.route = route
        server = route.server
        low = low_level_server(server)
        if low is None:
            return  # warned: cursors by FastMCP
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
            # when the listener was admitted: a few askers, each taking the next
            # listener (a task per listener would be thousands at once).
            waiting = iter(enumerate(held))

            async def ask() -> None:
                for index, (caller, gate) in waiting:
                    callers[index] = await self.caller_now(caller, gate)

            async with anyio.create_task_group() as askers:
                for _ in range(min(MAX_ASKING, len(held))):
                    askers.start_soon(ask)

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
        # Named as each client lists them (once per distinct change and route: views
        # and clients of one server share theirs).
        listed: dict[tuple[ViewChange, Route | None], ViewChange] = {}

        async def as_listed(change: ViewChange, route: Route | None) -> ViewChange:
            route = route or self.route
            if (change, route) not in listed:
                listed[change, route] = await self._as_listed(change, route)
            return listed[change, route]

        for (session_id, known), change in zip(sessions, legacy, strict=True):
            if change and not await send_legacy(known, await as_listed(change,
                                                                        known.route)):
                self._sessions.pop(session_id, None)
        for (bus, stream), change in zip(streams, listening, strict=True):
            if change:
                for event in _events(await as_listed(change, stream.route)):
                    await bus.publish(event)
        return True

    async def _as_listed(self, change: ViewChange, route: Route | None) -> ViewChange:
        """``change`` with its URIs as the clients ``route`` reaches list them."""
        if not change.updated:
            return change
        return dataclasses.replace(change, updated=frozenset(
            (await self._listed_uris(sorted(change.updated), route)).values()))

    async def _listed_uris(self, uris: list[str], route: Route | None) -> dict[str, str]:
        route = route or self.route
        return await route.uris(uris) if route is not None else {uri: uri for uri in uris}

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
        if caller is None or self.authenticate is None:
            return caller
        if gate is None:  # nothing to ask it again with (no path makes one): tell nothing
            return None
        try:
            # In no request's context (a run's status is told from inside its call):
            # the hook names the caller from ``gate`` alone.
            return await asyncio.create_task(self.authenticate(gate),
                                             context=contextvars.Context())
        except Exception:  # GateRefused, or anything else: tell this listener nothing
            return None

    def admitted(self) -> tuple[CallerIdentity | None, GateContext | None]:
        """The caller of the request being served, as notifications follow it: the one
        this server's gate admitted (the request's admission holds one record per gate
        it passed: a parent's and each mounted server's), else (no ``authenticator``)
        the verified token's; and what the authenticator admitted it from."""
        held = admission.current()
        record = held.nested_in(self.owner) if held is not None else None
        caller = record.caller if record is not None else None
        if caller is None and self.callers_from_token:
            caller = caller_from_token()
        return caller, record.asked if record is not None else None

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
        # As each listener's client lists them (once per route, once someone is told).
        named: dict[Route | None, frozenset[str]] = {}

        async def listed(route: Route | None) -> frozenset[str]:
            route = route or self.route
            if route not in named:
                named[route] = frozenset((await self._listed_uris(uris, route)).values())
            return named[route]

        async def sees(caller: CallerIdentity | None, gate: GateContext | None) -> bool:
            now = await self.caller_now(caller, gate)
            return _is(now, caller_id) and self.views.of(latest, now).allows(exposed)

        for session_id, known in sessions:
            if not await sees(known.caller_now(), known.gate):
                continue
            if not await send_legacy(known, ViewChange(updated=await listed(known.route))):
                self._sessions.pop(session_id, None)
        for bus, stream in streams:
            if await sees(stream.caller_now(), stream.gate):
                for uri in sorted(await listed(stream.route)):
                    await bus.publish(ResourceUpdated(uri=uri))

    # ------------------------------------------------------- listeners

    def stream(self, handler: ListenHandler, route: Route | None, expires: float | None
               ) -> Stream:
        """A listen stream served by ``handler`` for the request being served (the
        gate admitted it like a list: it follows that caller), its client reaching
        this server through ``route``, opened with a bearer token that expires at
        ``expires`` (None: never; it is told nothing after that)."""
        caller, asked = self.admitted()
        return Stream(handler, caller, asked, route, expires)

    def refusal(self, stream: Stream) -> str | None:
        """Why ``stream`` cannot be opened now (a cap it is over), else None."""
        if len(self._streams) >= self.max_streams:
            return "listen_streams_full"
        key = stream.caller.id if stream.caller is not None else None
        if self._streams_of[key] >= self.max_streams_per_caller:
            return "too_many_listen_streams"
        return None

    def open(self, bus: InMemorySubscriptionBus, stream: Stream) -> None:
        """Publish what changes to ``bus`` until :meth:`close` (check :meth:`refusal`
        first, with no await in between: concurrent listens cannot pass the caps
        together)."""
        self._streams[bus] = stream
        self._streams_of[stream.caller.id if stream.caller is not None else None] += 1

    def close(self, bus: InMemorySubscriptionBus) -> None:
        """Stop publishing to ``bus`` (its stream ended, however it ended)."""
        stream = self._streams.pop(bus, None)
        if stream is None:
            return
        key = stream.caller.id if stream.caller is not None else None
        self._streams_of[key] -= 1
        if not self._streams_of[key]:
            del self._streams_of[key]

    def subscribed(self, session_id: str, session: ServerSession, route: Route | None
                   ) -> set[str]:
        """The URIs a 2025-11-25 session is subscribed to (to add to or take from), its
        client naming this server's resources through ``route``. Any URI may be
        subscribed to: a hidden one simply never fires."""
        return self.remember(session_id, session).reached_by(route)


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
