"""Who change notifications are told to (:mod:`.notifications`): 2025-11-25 sessions
and 2026-07-28 listen streams, each with the caller it follows and when the bearer
token that caller came with expires."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mcp.server.session import ServerSession
from mcp.server.subscriptions import ListenHandler

from chainweaver.mcp.gate.admission import token_caller_and_expiry, token_expiry
from chainweaver.mcp.hooks import CallerIdentity, GateContext


@dataclass
class Session:
    """A 2025-11-25 session to notify: its latest session object, its subscriptions,
    and the caller last admitted on it (None: none yet, it is told nothing)."""

    session: ServerSession
    uris: set[str] = field(default_factory=set)
    caller: CallerIdentity | None = None
    gate: GateContext | None = None  # what the authenticator admitted the caller from
    expires: float | None = None  # when the token it was last admitted with expires

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

    def caller_now(self) -> CallerIdentity | None:
        """The caller to tell, None once the token it came with has expired: an expired
        credential hears nothing more until the client makes a request with a new one."""
        return None if _expired(self.expires) else self.caller


@dataclass
class Stream:
    """A 2026-07-28 listen stream to notify: its handler, the caller the gate admitted
    for it (None: it is told nothing), the request context the authenticator admitted
    that caller from, and when the bearer token it was opened with expires."""

    handler: ListenHandler
    caller: CallerIdentity | None
    gate: GateContext | None
    expires: float | None

    def caller_now(self) -> CallerIdentity | None:
        """The caller to tell, None once its token expired (the stream ends then, by a
        timer on the event loop's clock; that clock stands still while the host is
        suspended, so the wall clock is asked at every notice too)."""
        return None if _expired(self.expires) else self.caller


def _expired(expires: float | None) -> bool:
    """Whether a token expiring at ``expires`` (its ``exp``; None: never) has expired."""
    return expires is not None and expires <= time.time()
