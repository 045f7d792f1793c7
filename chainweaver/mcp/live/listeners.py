"""Who change notifications are told to (:mod:`.notifications`): 2025-11-25 sessions
and 2026-07-28 listen streams, each with the caller it follows, when the bearer token
that caller came with expires, and how its client names the server's resources; and
what is sent on a session.

A 2025-11-25 client hears of changes on its session (stdio, in memory, stateful
streamable HTTP); over stateless HTTP a request carries no session and nothing can
reach the client afterwards (:func:`notifiable_session_id`). A 2026-07-28 client
hears of them on its listen streams (:mod:`.subscriptions` serves them).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from fastmcp import Context
from fastmcp.server.dependencies import get_context, get_http_request
from mcp.server.session import ServerSession
from mcp.server.subscriptions import ListenHandler
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from chainweaver.mcp.gate.admission import token_caller_and_expiry, token_expiry
from chainweaver.mcp.gate.composition import Route
from chainweaver.mcp.hooks import CallerIdentity, GateContext
from chainweaver.mcp.live.view_changes import ViewChange

logger = logging.getLogger("chainweaver.mcp.live.listeners")


@dataclass
class Session:
    """A 2025-11-25 session to notify: its latest session object, its subscriptions,
    and the caller last admitted on it (None: none yet, it is told nothing)."""

    session: ServerSession
    uris: set[str] = field(default_factory=set)
    caller: CallerIdentity | None = None
    gate: GateContext | None = None  # what the authenticator admitted the caller from
    expires: float | None = None  # when the token it was last admitted with expires
    # How its client names this server's resources (set when it subscribes; None:
    # the server's own clients')
    route: Route | None = None

    def came_on(self, session: ServerSession) -> None:
        """A request came on this session as ``session`` (the SDK builds one session
        object per request): the newest is the one to send on."""
        self.session = session

    def admit(self, caller: CallerIdentity, gate: GateContext) -> None:
        """The gate admitted ``caller`` on this session, from ``gate`` (under an
        authenticator, which is asked again with it when there is news)."""
        self.caller, self.gate, self.expires = caller, gate, token_expiry()

    def follow_token(self) -> None:
        """No authenticator decides: the caller is the verified bearer token's, which
        rides on every request (and says when it stops being good)."""
        self.caller, self.expires = token_caller_and_expiry()

    def reached_by(self, route: Route | None) -> set[str]:
        """Its client names the server's resources through ``route``; the URIs it is
        subscribed to (to add to or take from)."""
        self.route = route
        return self.uris

    def caller_now(self) -> CallerIdentity | None:
        """The caller to tell, None once the token it came with has expired: an expired
        credential hears nothing more until the client makes a request with a new one."""
        return None if _expired(self.expires) else self.caller


@dataclass(frozen=True)
class Stream:
    """A 2026-07-28 listen stream to notify: its handler, the caller the gate admitted
    for it (None: it is told nothing), the request context the authenticator admitted
    that caller from, how its client names this server's resources (None: as the
    server's own clients do), and when the bearer token it was opened with expires."""

    handler: ListenHandler
    caller: CallerIdentity | None
    gate: GateContext | None
    route: Route | None
    expires: float | None

    def caller_now(self) -> CallerIdentity | None:
        """The caller to tell, None once its token expired (the stream ends then, by a
        timer on the event loop's clock; that clock stands still while the host is
        suspended, so the wall clock is asked at every notice too)."""
        return None if _expired(self.expires) else self.caller


def _expired(expires: float | None) -> bool:
    """Whether a token expiring at ``expires`` (its ``exp``; None: never) has expired."""
    return expires is not None and expires <= time.time()


async def send_legacy(known: Session, change: ViewChange) -> bool:
    """Tell a 2025-11-25 session ``change`` (updates: only of URIs it subscribed to);
    False: it cannot be reached any more (forget it)."""
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
