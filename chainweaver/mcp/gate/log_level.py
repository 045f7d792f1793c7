"""The level of log messages a 2025-11-25 client asked for with ``logging/setLevel``.

FastMCP keeps that level where no public API reads it (and moved it between 4.1 and
4.2), so the gate notes it itself: its middleware sees every ``logging/setLevel``
request, and the level is kept per session (FastMCP's public ``Context.session_id``:
a connection over stdio or in memory, the ``Mcp-Session-Id`` over stateful HTTP), in
a bounded map of the most recent sessions. Over stateless HTTP nothing is kept: a
request there has no session, only a header any client may choose. A run reads the
level back; finding none only means no run log messages for that client.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, get_args

from fastmcp.server.context import Context
from fastmcp.server.middleware import MiddlewareContext
from mcp_types import LoggingLevel

logger = logging.getLogger("chainweaver.mcp.gate.log_level")

LEVELS: tuple[str, ...] = get_args(LoggingLevel)  # by severity, lowest first
MAX_SESSIONS = 10_000  # sessions whose level is kept, most recent first


class SessionLevels:
    """The level each recent session set (at most ``MAX_SESSIONS`` of them)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._levels: OrderedDict[str, str] = OrderedDict()
        self._max = max_sessions
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._levels)

    def set(self, session_id: str, level: str) -> None:
        with self._lock:
            self._levels.pop(session_id, None)
            self._levels[session_id] = level
            while len(self._levels) > self._max:
                self._levels.popitem(last=False)

    def get(self, session_id: str) -> str | None:
        with self._lock:
            return self._levels.get(session_id)


SESSIONS = SessionLevels()


async def serve_set_level(context: MiddlewareContext, call_next: Any, *,
                          sessions: bool = True) -> Any:
    """Serve a ``logging/setLevel`` request, then note the level it set."""
    result = await call_next(context)
    remember(context, sessions=sessions)
    return result


def setting(call_next: Any, sessions: bool) -> Any:
    """``serve_set_level`` as the ``call_next`` of the gate that admits the request."""
    async def serve(context: MiddlewareContext) -> Any:
        return await serve_set_level(context, call_next, sessions=sessions)

    return serve


def remember(context: MiddlewareContext, *, sessions: bool = True) -> None:
    """Note the level of a ``logging/setLevel`` request the server has just accepted
    (``sessions=False``: the server keeps no sessions, stateless HTTP)."""
    params = context.message
    level = params.get("level") if isinstance(params, dict) else getattr(params, "level", None)
    ctx = context.fastmcp_context
    if not sessions or level not in LEVELS or ctx is None:
        return
    try:
        SESSIONS.set(ctx.session_id, str(level))
    except RuntimeError:  # no session to keep it for
        return


def client_log_level(ctx: Context) -> str | None:
    """The level this request's client set with ``logging/setLevel``, else the server's
    ``client_log_level`` (if the operator set one), else None."""
    try:
        level = SESSIONS.get(ctx.session_id)
    except RuntimeError:
        level = None
    if level is not None:
        return level
    default = ctx.fastmcp.client_log_level
    return str(default) if default is not None else None
