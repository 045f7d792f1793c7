"""Rate limiters for the security gate: in-process (the default), or shared by every
replica through Redis.

The gate hands a limiter the caller and a *budget name* (:func:`budget_name`): the
published name of the flow tool, resource or prompt a request reaches, the method of a
list, subscription, completion or task request, and :data:`UNPUBLISHED` for every name
the caller's view does not publish. So a caller's requests for names that do not
exist share one budget however many names it invents, and what a limiter keeps per
caller is bounded by what the server publishes, never by what clients send.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chainweaver.mcp.hooks import CallerIdentity, GateContext, RequestKind
from chainweaver.mcp.publish.decision import INDEX_URI
from chainweaver.mcp.publish.run_uris import RUNS_URI, is_run_uri

if TYPE_CHECKING:
    from chainweaver.mcp.publish.exposure import Exposure
    from chainweaver.mcp.publish.live_exposure import LiveExposure

# The one budget name of every request for a name the caller's view does not publish
# (an unknown, excluded or hidden flow, a mistyped URI): never the name itself. No
# published name can take this form (tool and prompt names hold no parentheses, URIs
# have a scheme).
UNPUBLISHED = "(unpublished)"
# Requests whose gate name is one of these methods (chosen by the server, never the
# client) count under that method.
_METHOD_KINDS = frozenset({"list", "subscription", "task"})


def budget_name(gate: GateContext, exposure: Exposure | LiveExposure,
                runs_root: str = RUNS_URI) -> str:
    """The name a request counts under with ``per_name`` budgets (see the module doc).

    ``gate`` is the request as the caller may know it: ``flow_name`` is None unless
    the name reaches an exposed flow inside the caller's view. A flow outside the view
    counts exactly like a name that never existed, so budgets tell a caller nothing
    about flows it cannot see. ``runs_root``: where the request's client reaches the
    run resources (a composition may put them elsewhere than ``chainweaver://runs``).
    """
    return budget_name_of(gate.kind, gate.name, gate.flow_name is not None, exposure,
                          runs_root)


def budget_name_of(kind: RequestKind, name: str, reaches_flow: bool,
                   exposure: Exposure | LiveExposure, runs_root: str = RUNS_URI) -> str:
    """:func:`budget_name` of a ``kind`` request for ``name``; ``reaches_flow``: the
    name reaches an exposed flow inside the caller's view."""
    if kind in _METHOD_KINDS:
        return name
    if kind == "completion":
        # The reference names a prompt or a template: any string the client likes.
        return "completion/complete"
    if kind == "resource" and is_run_uri(name, runs_root):
        # Every run resource, the caller's own or not: one budget, whatever the id, and
        # wherever a composition lets clients reach it.
        return RUNS_URI
    if reaches_flow:
        return name  # resolved to one published tool, schema resource or prompt
    # Published, but of no flow: the guide, a server-level prompt, the index. They are
    # in every caller's view. (A flow's prompt is here only when the flow is outside
    # the caller's view: unpublished, for this caller.)
    if kind == "prompt":
        entry = exposure.prompt(name)
        if entry is not None and entry.exposed_flow is None:
            return name
    if kind == "resource" and exposure.expose_schemas and name == INDEX_URI:
        return name
    return UNPUBLISHED


class FixedWindowRateLimiter:
    """At most ``limit`` requests per caller per ``window_seconds`` window.

    With ``per_name=True`` the budget is per caller *and* budget name (see
    :func:`budget_name`: a published name, or one shared budget for every name that is
    not). Only the current window's counters are kept: at most callers x (published
    names + 1) under the gate.
    """

    def __init__(
        self,
        limit: int,
        window_seconds: float = 60.0,
        *,
        per_name: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1 or window_seconds <= 0:
            raise ValueError("limit must be >= 1 and window_seconds > 0")
        self.limit = limit
        self.window_seconds = window_seconds
        self.per_name = per_name
        self._clock = clock
        self._window: int | None = None
        self._counts: dict[Any, int] = {}  # the current window's counters only
        self._lock = threading.Lock()

    @property
    def tracked_keys(self) -> int:
        """How many counters are held (for monitoring memory use)."""
        return len(self._counts)

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        key = (caller.id, name) if self.per_name else caller.id
        window = int(self._clock() // self.window_seconds)
        with self._lock:
            if self._window is None or window > self._window:
                # A new window: every past count is void, so drop them all at once.
                self._window, self._counts = window, {}
            count = self._counts.get(key, 0)
            if count >= self.limit:
                return False
            self._counts[key] = count + 1
            return True


# One atomic step per request: count it in the current window, start the window's
# expiry with the first request, and admit while the count is within the limit.
_COUNT_IN_WINDOW = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return count
"""


class RedisRateLimiter:
    """At most ``limit`` requests per caller per ``window_seconds``, counted in Redis, so
    every replica sharing the Redis shares one budget (needs the ``tasks`` extra).

    Fixed windows of wall-clock time (replicas' clocks should agree to well within a
    window); one Lua script per request, so concurrent requests never over-admit.
    When Redis cannot be reached the request is refused (``rate_limiter_error``):
    a limit that silently stopped holding would be worse. ``per_name=True``: a budget
    per caller and budget name, as :class:`FixedWindowRateLimiter`.
    """

    def __init__(
        self,
        url: str,
        limit: int,
        window_seconds: float = 60.0,
        *,
        per_name: bool = False,
        prefix: str = "chainweaver:rate",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if limit < 1 or window_seconds <= 0:
            raise ValueError("limit must be >= 1 and window_seconds > 0")
        from redis.asyncio import Redis  # the tasks extra

        self.limit = limit
        self.window_seconds = window_seconds
        self.per_name = per_name
        self.prefix = prefix
        self._clock = clock
        self._redis = Redis.from_url(url)
        self._script = self._redis.register_script(_COUNT_IN_WINDOW)
        self._expire_ms = max(1, math.ceil(window_seconds * 1000))

    def key(self, caller: CallerIdentity, name: str) -> str:
        """The Redis key counting ``caller``'s requests in the current window.

        Under the gate ``name`` is a budget name (:func:`budget_name`), so the live
        keys number at most callers x (published names + 1) per window, and each
        expires ``window_seconds`` after its window's first request.
        """
        who = f"{caller.id}\0{name}" if self.per_name else caller.id
        # Hashed: caller ids and names are client-influenced; keys stay short and inert.
        digest = hashlib.sha256(who.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        window = int(self._clock() // self.window_seconds)
        return f"{self.prefix}:{digest}:{window}"

    async def acquire(self, caller: CallerIdentity, name: str) -> bool:
        count = await self._script(keys=[self.key(caller, name)], args=[self._expire_ms])
        return int(count) <= self.limit

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()
