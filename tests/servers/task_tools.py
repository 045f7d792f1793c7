"""Tools for the background-task tests (tests/servers/task_flows/*.flow.yaml).

Side effects are counted where every process sees them: in Redis under
``CW_TASK_REDIS`` (a URL) when set, else in ``COUNTS`` in this process. ``CW_TASK_SLEEP``
(seconds) makes ``charge`` and ``lookup`` slow, so a test can kill a worker mid-run.
In-memory tests may set ``HOLD`` to an ``asyncio.Event`` that ``enrich`` waits for.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

from pydantic import BaseModel

from chainweaver import SideEffectLevel, ToolSafetyContract, tool

READ = ToolSafetyContract(SideEffectLevel.READ)
WRITE = ToolSafetyContract(SideEffectLevel.WRITE, idempotent=False)
APPROVED_WRITE = ToolSafetyContract(SideEffectLevel.WRITE, idempotent=False,
                                    requires_approval=True, approval_reason="refunds money")
COUNTS: Counter[str] = Counter()
HOLD: asyncio.Event | None = None


class Number(BaseModel):
    n: int


class Order(BaseModel):
    order: str


class Counted(BaseModel):
    order: str
    count: int


async def _count(key: str) -> int:
    url = os.environ.get("CW_TASK_REDIS")
    if not url:
        COUNTS[key] += 1
        return COUNTS[key]
    import redis.asyncio as redis

    client = redis.Redis.from_url(url)
    try:
        return int(await client.incr(f"cw-test:{key}"))
    finally:
        await client.aclose()


async def _pause() -> None:
    await asyncio.sleep(float(os.environ.get("CW_TASK_SLEEP", "0")))


@tool(safety=READ)
async def fetch(n: int) -> Number:
    """Read a number."""
    return Number(n=n + 1)


@tool(safety=READ)
async def enrich(n: int) -> Number:
    """Enrich it (waits for HOLD when a test set one; counts being cancelled there)."""
    COUNTS["enrich"] += 1
    if HOLD is not None:
        try:
            await HOLD.wait()
        except asyncio.CancelledError:
            COUNTS["enrich-cancelled"] += 1
            raise
    return Number(n=n * 10)


@tool(safety=READ)
async def finish(n: int) -> Number:
    """Finish."""
    COUNTS["finish"] += 1
    return Number(n=n + 1)


@tool(safety=WRITE)
async def charge(order: str) -> Counted:
    """Charge an order once: a side effect that must never happen twice."""
    count = await _count(f"charge:{order}")
    await _pause()
    return Counted(order=order, count=count)


@tool(safety=READ)
async def lookup(order: str) -> Counted:
    """Look an order up: safe to repeat."""
    count = await _count(f"lookup:{order}")
    await _pause()
    await _count(f"lookup-finished:{order}")
    return Counted(order=order, count=count)


@tool(safety=APPROVED_WRITE)
async def refund(order: str) -> Counted:
    """Refund an order once, after the user approved it (``--approval elicit``)."""
    return Counted(order=order, count=await _count(f"refund:{order}"))
