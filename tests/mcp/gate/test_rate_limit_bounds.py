"""Per-name rate budgets hold whatever names a caller sends, and the limiters' memory
(and Redis keys) stays bounded by what the server publishes, never by what clients send.

A name that is not published (unknown, excluded, outside the caller's view) counts
under one shared budget per caller; only published names have budgets of their own.
Always through a real in-memory MCP client, on both protocol eras.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import anyio
import mcp_types
import pytest
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import MCPError
from support.catalogue import build_catalogue

from chainweaver.mcp import (
    GATE_REFUSED,
    CallerIdentity,
    FixedWindowRateLimiter,
    FlowServer,
    GateContext,
    SecurityConfig,
    visible_claim,
)
from chainweaver.mcp.gate.rate_limit import UNPUBLISHED

MODES = ["auto", "legacy"]  # 2026-07-28, 2025-11-25
BUDGET = 3
RATE_LIMITED = {"code": GATE_REFUSED, "message": "Request refused: rate_limited",
                "data": {"reason": "rate_limited"}}
TOOLS = ["product_search", "order_status", "price_quote", "failing_flow"]
RESOURCES = ["chainweaver://flows", *(f"chainweaver://flows/{t}/schema" for t in TOOLS)]
PROMPTS = ["chainweaver_guide", *TOOLS, "product_search__brief", "product_search__compare"]
EXCLUDED_TOOLS = ["write_flow", "draft_report", "archived_search", "unknown_safety"]
# Every budget name a server-chosen method may have (lists, completions, subscriptions).
METHODS = ["tools/list", "resources/list", "resources/templates/list", "prompts/list",
           "completion/complete", "subscriptions/listen", "resources/subscribe",
           "resources/unsubscribe"]
BUDGET_NAMES = {*TOOLS, *RESOURCES, *PROMPTS, *METHODS, UNPUBLISHED}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recording(FixedWindowRateLimiter):
    """The included limiter, remembering every name the gate hands it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.names: list[str] = []

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        self.names.append(name)
        return super().acquire(caller, name)


class Switch:
    """An authenticator whose caller the test switches; teams ride in a claim."""

    TEAMS = {"sam": ["search-team"], "olga": ["orders-team", "pricing-team"],
             "mallory": [], "eve": []}

    def __init__(self, who: str = "mallory") -> None:
        self.who = who

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who, {"teams": self.TEAMS[self.who]})


def server(limiter: Any, *, visible: Any = None, authenticator: Any = None) -> FlowServer:
    return FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(rate_limiter=limiter,
                                              authenticator=authenticator or Switch(),
                                              visible=visible))


def invented(prefix: str = "") -> Iterator[str]:
    while True:
        yield f"{prefix}{secrets.token_hex(8)}"


def mixed(kinds: list[str], words: Iterator[str], count: int) -> list[tuple[str, str]]:
    """``count`` requests, cycling through ``kinds``."""
    return [(kinds[n % len(kinds)], next(words)) for n in range(count)]


async def request(client: Client, kind: str, name: str) -> mcp_types.ErrorData | None:
    """Send one request; the error it got (None: answered)."""
    try:
        if kind == "tool":
            await client.session.call_tool(name, {})
        elif kind == "resource":
            await client.session.read_resource(name)
        elif kind == "prompt":
            await client.session.get_prompt(name, {})
        else:  # a completion for a prompt that may or may not exist
            await client.session.complete(mcp_types.PromptReference(type="ref/prompt",
                                                                    name=name),
                                          {"name": "query", "value": ""})
    except MCPError as error:
        return error.error
    return None


def refused(error: mcp_types.ErrorData | None) -> bool:
    """Refused by the limiter, in exactly the gate's refusal shape."""
    if error is None or error.code != GATE_REFUSED:
        return False
    assert error.model_dump(exclude_none=True) == RATE_LIMITED
    return True


def invented_target(kind: str, word: str) -> str:
    if kind == "resource":
        return f"chainweaver://flows/{quote(word, safe='')}/schema"
    return word


# ------------------------------------------------------------- in memory


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["tool", "resource", "prompt", "completion"])
async def test_thirty_invented_names_are_admitted_only_up_to_the_budget(
        mode: str, kind: str) -> None:
    limiter = Recording(BUDGET, 60, per_name=True, clock=Clock())
    async with Client(server(limiter).fastmcp, mode=mode) as client:
        limiter.names.clear()  # whatever the client sent on connecting
        admitted = [not refused(await request(client, kind, invented_target(kind, word)))
                    for word in itertools.islice(invented(), 30)]
    assert admitted == [True] * BUDGET + [False] * (30 - BUDGET)
    # No invented name was ever handed to the limiter, nor kept by it.
    assert set(limiter.names) <= BUDGET_NAMES
    assert limiter.tracked_keys <= len(BUDGET_NAMES)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_every_kind_of_unpublished_name_draws_on_one_shared_budget(mode: str) -> None:
    limiter = Recording(BUDGET, 60, per_name=True, clock=Clock())
    kinds = ["tool", "resource", "prompt"]
    async with Client(server(limiter).fastmcp, mode=mode) as client:
        admitted = [not refused(await request(client, kind, invented_target(kind, word)))
                    for kind, word in mixed(kinds, invented("x"), 30)]
        assert admitted == [True] * BUDGET + [False] * (30 - BUDGET)
        # An excluded flow is a name that never existed: it has no budget of its own.
        for name in EXCLUDED_TOOLS:
            assert refused(await request(client, "tool", name))
        # Published names keep their own budgets, each used up on its own.
        for name in ("price_quote", "product_search"):
            answers = [await request(client, "tool", name) for _ in range(BUDGET + 1)]
            assert [refused(answer) for answer in answers] == [False] * BUDGET + [True]
        assert not refused(await request(client, "prompt", "chainweaver_guide"))
        assert not refused(await request(client, "resource", "chainweaver://flows"))


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_flow_outside_the_callers_view_counts_like_a_name_that_never_existed(
        mode: str) -> None:
    limiter = Recording(1, 60, per_name=True, clock=Clock())
    switch = Switch("sam")  # sees product_search and failing_flow only
    served = server(limiter, visible=visible_claim("teams"), authenticator=switch)
    async with Client(served.fastmcp, mode=mode) as client:
        assert not refused(await request(client, "tool", "never_existed"))
        # price_quote is olga's: for sam it shares the unpublished budget, spent above,
        # so the budget tells sam nothing about it.
        assert refused(await request(client, "tool", "price_quote"))
        assert refused(await request(client, "resource",
                                     "chainweaver://flows/price_quote/schema"))
        for prompt in ("price_quote", "order_status"):  # their invocation prompts
            assert refused(await request(client, "prompt", prompt))
        assert not refused(await request(client, "tool", "product_search"))
        switch.who = "olga"  # in olga's view it has a budget of its own
        assert not refused(await request(client, "tool", "price_quote"))
    assert limiter.names == [UNPUBLISHED] * 5 + ["product_search", "price_quote"]


@pytest.mark.anyio
async def test_per_caller_budgets_stay_separate_for_unpublished_names() -> None:
    switch = Switch("mallory")
    limiter = FixedWindowRateLimiter(BUDGET, 60, per_name=True, clock=Clock())
    async with Client(server(limiter, authenticator=switch).fastmcp) as client:
        for word in itertools.islice(invented(), BUDGET):
            assert not refused(await request(client, "tool", word))
        assert refused(await request(client, "tool", "one-more"))
        switch.who = "eve"  # another caller's unpublished budget is untouched
        assert not refused(await request(client, "tool", "one-more"))


def test_only_the_current_windows_counters_are_kept() -> None:
    clock = Clock()
    limiter = FixedWindowRateLimiter(1, window_seconds=10, per_name=True, clock=clock)
    for caller in ("a", "b", "c"):
        assert limiter.acquire(CallerIdentity(caller), "price_quote")
        assert not limiter.acquire(CallerIdentity(caller), "price_quote")
    assert limiter.tracked_keys == 3
    clock.now += 10  # the next window: every past counter is dropped at once
    assert limiter.acquire(CallerIdentity("a"), "price_quote")
    assert limiter.tracked_keys == 1


REQUEST = st.tuples(
    st.sampled_from(["tool", "resource", "prompt", "completion"]),
    st.one_of(st.sampled_from([*TOOLS, *PROMPTS, *EXCLUDED_TOOLS, UNPUBLISHED, "",
                               "tools/list", "(unpublished) "]),
              st.text(st.characters(exclude_categories=["Cs"]), max_size=24)),
    st.sampled_from(["mallory", "eve"]),
    st.sampled_from([0.0, 0.0, 0.0, 7.0]),  # seconds to move the clock first
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(REQUEST, min_size=1, max_size=40))
def test_any_stream_of_names_keeps_the_limiter_bounded(
        stream: list[tuple[str, str, str, float]]) -> None:
    clock = Clock()
    switch = Switch()
    limiter = Recording(BUDGET, 10, per_name=True, clock=clock)
    served = server(limiter, authenticator=switch)
    callers = {"mallory", "eve"}
    # The most counters a window may need: every caller x every budget name.
    bound = len(callers) * len(BUDGET_NAMES)

    published = {"tool": set(TOOLS), "resource": set(RESOURCES), "prompt": set(PROMPTS)}
    admitted: dict[tuple[str, int, str], int] = {}  # (caller, window, budget) -> count

    async def run() -> None:
        async with Client(served.fastmcp) as client:
            for kind, word, who, advance in stream:
                clock.now += advance
                switch.who = who
                name = invented_target(kind, word) if kind == "resource" and \
                    word not in RESOURCES else word
                if not refused(await request(client, kind, name)):
                    budget = "completion" if kind == "completion" else \
                        name if name in published[kind] else UNPUBLISHED
                    key = (who, int(clock.now // 10), budget)
                    admitted[key] = admitted.get(key, 0) + 1
                assert limiter.tracked_keys <= bound

    anyio.run(run)
    assert set(limiter.names) <= BUDGET_NAMES
    # Whatever the names, each caller got at most one budget per window for all of its
    # unpublished names together (and one for all of its completions).
    assert all(count <= BUDGET for count in admitted.values())


# ----------------------------------------------------------------- Redis


@pytest.mark.slow
@pytest.mark.tasks
@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_the_redis_limiter_admits_the_budget_and_keeps_its_keys_bounded(
        redis_url: str, mode: str) -> None:
    from redis.asyncio import Redis

    from chainweaver.mcp.gate.rate_limit import RedisRateLimiter

    url = redis_url.rsplit("/", 1)[0] + "/11"  # a database of its own, to count keys
    limiter = RedisRateLimiter(url, BUDGET, 60, per_name=True, prefix=f"t-bounds-{mode}")
    redis = Redis.from_url(url)
    await redis.flushdb()
    try:
        async with Client(server(limiter).fastmcp, mode=mode) as client:
            before = await redis.dbsize()  # the client's own lists on connecting
            kinds = ["tool", "resource", "prompt", "completion"]
            admitted = [not refused(await request(client, kind, invented_target(kind, w)))
                        for kind, w in mixed(kinds, invented(), 40)]
            assert sum(admitted) == 2 * BUDGET  # the unpublished budget + completions'
            # Two counters (the unpublished names', the completions'), not forty.
            assert await redis.dbsize() <= before + 2
            for name in ("price_quote", "product_search"):
                answers = [await request(client, "tool", name) for _ in range(BUDGET + 1)]
                assert [refused(answer) for answer in answers] == [False] * BUDGET + [True]
            assert await redis.dbsize() <= before + 4
        for key in await redis.keys("*"):
            ttl = await redis.pttl(key)
            assert 0 < ttl <= 60_000  # every counter expires with its window
    finally:
        await redis.flushdb()
        await redis.aclose()
        await limiter.aclose()
