"""Waiting for an async condition, bounded: a broken build fails instead of hanging."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio


async def until(check: Callable[[], Awaitable[Any]], what: str, limit: float,
                poll: float = 0.02) -> Any:
    """Await ``check()`` every ``poll`` seconds until it answers something truthy, and
    return that answer; fail naming ``what`` after ``limit`` seconds of polls (a bound
    that only stops a hang, never a speed requirement)."""
    for _ in range(max(1, int(limit / poll))):
        answer = await check()
        if answer:
            return answer
        await anyio.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")
