"""The subscription requests of one FastMCP server, for every FlowServer its clients reach.

A FlowServer's clients subscribe on the server they talk to: its own FastMCP, or a
parent it is mounted into with ``mount_into``. FastMCP serves neither
``subscriptions/listen`` (2026-07-28) nor ``resources/subscribe`` /
``resources/unsubscribe`` (2025-11-25), and one server has one handler per method, so
each server gets one :class:`Subscriptions`, registered on its low-level server
(:func:`chainweaver.mcp.fastmcp_seams.low_level_server`) by the first FlowServer
that needs it; every FlowServer its clients reach joins it with its
:class:`~.notifications.ChangeNotifier` and the :class:`Route` its clients reach it
by. One listen stream (one bus) is then followed by every member's notifier, each as
the caller its own gate admitted the request as, under its own caps, and told what
changes in that caller's view, named as the stream's client lists it; a subscribed
URI is kept by every member's record of the session.

The gates admit these requests before they get here (a FlowServer's
:class:`~chainweaver.mcp.gate.security.SecurityGate` on its own server, each mounted
one's :class:`~chainweaver.mcp.gate.mounting.MountedGate` on a parent): a request
refused by any gate never reaches this.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import mcp_types
from fastmcp import FastMCP
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler

from chainweaver.mcp.fastmcp_seams import low_level_server
from chainweaver.mcp.gate.admission import token_expiry
from chainweaver.mcp.gate.composition import Route
from chainweaver.mcp.gate.security import refusal_error
from chainweaver.mcp.live.listeners import notifiable_session_id
from chainweaver.mcp.live.notifications import ChangeNotifier

logger = logging.getLogger("chainweaver.mcp.live.subscriptions")

LISTEN = "subscriptions/listen"


@dataclass(frozen=True)
class Member:
    """A FlowServer whose changes a server's clients hear: its notifier, the route
    they reach it by, and whether it has resources to subscribe to."""

    notifier: ChangeNotifier
    route: Route
    resources: bool


class Subscriptions:
    """Serves one FastMCP server's subscription requests for its member FlowServers."""

    def __init__(self) -> None:
        self.members: list[Member] = []

    @classmethod
    def serve(cls, server: FastMCP, notifier: ChangeNotifier, route: Route, *,
              resources: bool) -> Subscriptions | None:
        """Make ``server``'s clients hear ``notifier``'s changes, reaching its
        FlowServer by ``route``: serve ``subscriptions/listen`` on ``server`` (and,
        with ``resources``, ``resources/subscribe`` and ``resources/unsubscribe``).
        None: this FastMCP cannot be reached (warned once), or another handler serves
        listen streams on ``server`` already (kept; warned)."""
        low = low_level_server(server)
        if low is None:
            return None
        entry = low.get_request_handler(LISTEN)
        held = getattr(entry.handler, "__self__", None) if entry is not None else None
        if entry is not None and not isinstance(held, cls):
            logger.warning("FastMCP server %r serves %s with a handler of its own: its "
                           "clients hear no change of the FlowServers it serves",
                           server.name, LISTEN)
            return None
        subscriptions = held if isinstance(held, cls) else cls()
        subscriptions.members.append(Member(notifier, route, resources))
        low.add_request_handler(LISTEN, mcp_types.SubscriptionsListenRequestParams,
                                subscriptions.listen)
        if resources:
            low.add_request_handler("resources/subscribe",
                                    mcp_types.SubscribeRequestParams,
                                    subscriptions.subscribe)
            low.add_request_handler("resources/unsubscribe",
                                    mcp_types.UnsubscribeRequestParams,
                                    subscriptions.unsubscribe)
        return subscriptions

    async def listen(self, ctx: Any, params: mcp_types.SubscriptionsListenRequestParams
                     ) -> mcp_types.SubscriptionsListenResult:
        """One listen stream, followed by every member (each as its gate's caller),
        for as long as it stays open: the client leaves, its connection ends, the
        server stops, or the bearer token it was opened with expires (gracefully:
        its result is the last frame; the client listens again with a new one)."""
        bus = InMemorySubscriptionBus()
        handler = ListenHandler(bus)
        expires = token_expiry()
        streams = [(member.notifier, member.notifier.stream(handler, member.route,
                                                            expires))
                   for member in self.members]
        # Every cap checked, then every stream taken, with no await in between:
        # concurrent listens cannot pass the caps together. The gates audit the
        # refusal as a denial.
        for notifier, stream in streams:
            refused = notifier.refusal(stream)
            if refused is not None:
                raise refusal_error(refused)
        for notifier, stream in streams:
            notifier.open(bus, stream)
        ending = None
        try:
            # The timer runs on the event loop's clock, which stands still while the
            # host is suspended: each notice checks the wall clock too (the streams'
            # records hold ``expires``).
            if expires is not None:
                ending = asyncio.get_running_loop().call_later(
                    max(0.0, expires - time.time()), handler.close)
            result: mcp_types.SubscriptionsListenResult = await handler(ctx, params)
            return result
        finally:
            if ending is not None:
                ending.cancel()
            for notifier, _ in streams:
                notifier.close(bus)

    async def subscribe(self, ctx: Any, params: mcp_types.SubscribeRequestParams
                        ) -> mcp_types.EmptyResult:
        # Any URI may be subscribed to (a hidden one simply never fires): the answer
        # says nothing about what exists.
        for uris in self._subscribed(ctx):
            uris.add(str(params.uri))
        return mcp_types.EmptyResult()

    async def unsubscribe(self, ctx: Any, params: mcp_types.UnsubscribeRequestParams
                          ) -> mcp_types.EmptyResult:
        for uris in self._subscribed(ctx):
            uris.discard(str(params.uri))
        return mcp_types.EmptyResult()

    def _subscribed(self, ctx: Any) -> list[set[str]]:
        """The URIs this request's session is subscribed to, as each member with
        resources keeps them (none without a session to notify)."""
        session_id = notifiable_session_id()
        if session_id is None:
            return []
        return [member.notifier.subscribed(session_id, ctx.session, member.route)
                for member in self.members if member.resources]
