"""Rate limiters for the security gate: in-process (the default), or shared by every
replica through Redis."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .hooks import CallerIdentity

PRUNE_ABOVE = 10_000  # counters kept before past windows are dropped


class FixedWindowRateLimiter:
    """At most ``limit`` requests per caller per ``window_seconds`` window.

    With ``per_name=True`` the budget is per caller *and* published name.
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
        self._windows: dict[Any, tuple[int, int]] = {}
        self._pruned_window = -1
        self._lock = threading.Lock()

    @property
    def tracked_keys(self) -> int:
        """How many counters are held (for monitoring memory use)."""
        return len(self._windows)

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        key = (caller.id, name) if self.per_name else caller.id
        window = int(self._clock() // self.window_seconds)
        with self._lock:
            if window != self._pruned_window and len(self._windows) > PRUNE_ABOVE:
                # Once per window, drop the counts of past windows, so many callers (or
                # names) cannot grow memory without bound.
                self._windows = {k: v for k, v in self._windows.items() if v[0] == window}
                self._pruned_window = window
            current, count = self._windows.get(key, (window, 0))
            if current != window:
                count = 0
            if count >= self.limit:
                self._windows[key] = (window, count)
                return False
            self._windows[key] = (window, count + 1)
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
    a limit that silently stopped holding would be worse.
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
        """The Redis key counting ``caller``'s requests in the current window."""
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
