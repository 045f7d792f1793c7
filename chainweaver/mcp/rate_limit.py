"""An in-process rate limiter for the security gate."""

from __future__ import annotations

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
