"""The Redis-shared rate limiter against a real Redis: atomic under concurrency, windows,
per-name budgets, and a refusal (never an admission) when Redis is unreachable."""

from __future__ import annotations

import asyncio
import re

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue
from support.procs import free_port

from chainweaver.mcp import CallerIdentity, FlowServer, SecurityConfig
from chainweaver.mcp.gate.rate_limit import RedisRateLimiter

pytestmark = pytest.mark.slow
ALICE, BOB = CallerIdentity("alice"), CallerIdentity("bob")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.anyio
async def test_concurrent_requests_never_exceed_the_budget(redis_url: str) -> None:
    limiter = RedisRateLimiter(redis_url, 10, 60, prefix="t-concurrent")
    first = RedisRateLimiter(redis_url, 10, 60, prefix="t-concurrent")  # another replica
    try:
        admitted = await asyncio.gather(*(
            (limiter if n % 2 else first).acquire(ALICE, "x") for n in range(50)))
        assert admitted.count(True) == 10
        assert await limiter.acquire(BOB, "x") is True  # a budget of its own
    finally:
        await limiter.aclose()
        await first.aclose()


@pytest.mark.anyio
async def test_windows_and_per_name_budgets(redis_url: str) -> None:
    clock = Clock()
    limiter = RedisRateLimiter(redis_url, 1, 10, per_name=True, prefix="t-window",
                               clock=clock)
    try:
        assert await limiter.acquire(ALICE, "a") is True
        assert await limiter.acquire(ALICE, "b") is True
        assert await limiter.acquire(ALICE, "a") is False
        clock.now += 10  # the next window
        assert await limiter.acquire(ALICE, "a") is True
        # Caller ids are hashed into the key: nothing a client sends shapes it.
        assert re.fullmatch(r"t-window:[0-9a-f]{32}:\d+",
                            limiter.key(CallerIdentity("x:y\0z *"), "n:*"))
    finally:
        await limiter.aclose()


@pytest.mark.anyio
async def test_an_unreachable_redis_refuses_the_request() -> None:
    limiter = RedisRateLimiter(f"redis://127.0.0.1:{free_port()}/0", 5, 60)
    server = FlowServer(build_catalogue(), security=SecurityConfig(rate_limiter=limiter,
                                                                   hook_timeout=5))
    async with Client(server.fastmcp) as client:
        with pytest.raises(MCPError) as caught:
            await client.session.call_tool("price_quote", {"sku": "S"})
    assert caught.value.error.data == {"reason": "rate_limiter_error"}
    await limiter.aclose()


def test_nonsense_settings_are_refused(redis_url: str) -> None:
    with pytest.raises(ValueError):
        RedisRateLimiter(redis_url, 0)
    with pytest.raises(ValueError):
        RedisRateLimiter(redis_url, 1, window_seconds=0)
