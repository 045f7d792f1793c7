"""Retention on both stores. In memory, past ``max_runs`` the caller holding the most
runs gives up its oldest, so one busy caller cannot push every other caller's runs
out. On Redis, the per-caller indexes are bounded like the records: each keeps at most
``max_runs`` ids, none older than ``max_age`` and none of a deleted run, and a new run
never keeps stale ids alive."""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter

import pytest

from chainweaver.mcp.runs.records import MemoryRunStore, RunQuery, RunRecord

_seq = itertools.count(1)


def record(caller: str, flow: str = "f", started: float | None = None) -> RunRecord:
    started = time.time() if started is None else started
    number = next(_seq)
    return RunRecord(f"{number:024x}", flow, "1.0.0", flow, caller,
                     int(started * 1e6) + number, started)


async def held(store: MemoryRunStore) -> dict[str, list[str]]:
    """Each caller's run ids, oldest first."""
    records, _ = await store.page(RunQuery(limit=10_000))
    by: dict[str, list[str]] = {}
    for each in reversed(records):
        by.setdefault(each.caller, []).append(each.run_id)
    return by


@pytest.mark.anyio
async def test_one_busy_caller_displaces_its_own_runs_not_the_others() -> None:
    store = MemoryRunStore(max_runs=10, max_age=3600)
    quiet = [record("quiet") for _ in range(2)]
    other = [record("other") for _ in range(3)]
    busy = [record("busy") for _ in range(100)]
    for each in [*quiet, *other, *busy]:
        await store.save(each, new=True)
    kept = await held(store)
    assert kept == {"quiet": [r.run_id for r in quiet], "other": [r.run_id for r in other],
                    "busy": [r.run_id for r in busy[-5:]]}  # its newest, the rest's all
    assert await store.get(busy[0].run_id) is None
    busy[0].status = "completed"  # a run retention dropped ends: it stays dropped
    await store.save(busy[0])
    assert await store.get(busy[0].run_id) is None and await held(store) == kept
    # The quiet caller gets busy in turn: shares even out, the total stays 10.
    more = [record("quiet") for _ in range(20)]
    for each in more:
        await store.save(each, new=True)
    kept = await held(store)
    assert {caller: len(ids) for caller, ids in kept.items()} == \
        {"quiet": 4, "other": 3, "busy": 3}
    assert kept["quiet"] == [r.run_id for r in more[-4:]]


@pytest.mark.anyio
async def test_past_max_runs_the_largest_holder_loses_its_oldest_run() -> None:
    # The documented rule, at every step of a random history: the total stays within
    # max_runs, a run is dropped only from the caller holding the most (of equals, the
    # one whose oldest run is older), always its oldest, so a caller holding no more
    # than max_runs / (callers holding runs) never loses one.
    chosen = random.Random(32)
    store = MemoryRunStore(max_runs=12, max_age=3600)
    callers = ["a", "b", "c", "d", "e"]
    before = await held(store)
    for _ in range(300):
        caller = chosen.choice(callers[:chosen.randint(1, len(callers))])
        new = record(caller, flow=chosen.choice(["f", "g"]))
        await store.save(new, new=True)
        after = await held(store)
        assert sum(len(ids) for ids in after.values()) <= 12
        grown = {c: [*before.get(c, []), *([new.run_id] if c == caller else [])]
                 for c in set(before) | {caller}}
        lost = {c: [i for i in ids if i not in after.get(c, [])] for c, ids in grown.items()}
        lost = {c: ids for c, ids in lost.items() if ids}
        if lost:
            (loser, ids), = lost.items()
            counts = Counter({c: len(i) for c, i in grown.items()})
            largest = max(counts.values())
            equals = [c for c in counts if counts[c] == largest]
            assert loser == min(equals, key=lambda c: grown[c][0]), (loser, counts)
            assert ids == [grown[loser][0]]
            assert counts[loser] > 12 / len(counts)
        before = after


@pytest.mark.anyio
@pytest.mark.slow
@pytest.mark.tasks
async def test_redis_indexes_keep_at_most_max_runs_live_young_ids(redis_url: str) -> None:
    from redis.asyncio import Redis

    from chainweaver.mcp.runs.redis_records import RedisRunStore

    prefix = f"trim:{time.time_ns()}"
    store = RedisRunStore(redis_url, max_runs=5, max_age=3600, prefix=prefix)
    redis = Redis.from_url(redis_url)
    try:
        # A run older than max_age first (a replica's late write), then a quiet
        # caller, then 100 runs of one busy caller on two flows.
        await store.save(record("busy", started=time.time() - 7200), new=True)
        for _ in range(3):
            await store.save(record("quiet"), new=True)
        busy = [record("busy", flow="fg"[index % 2]) for index in range(100)]
        for each in busy:
            await store.save(each, new=True)
        busy[0].status = "completed"  # a run retention dropped ends: it stays dropped
        await store.save(busy[0])
        assert await store.get(busy[0].run_id) is None
        indexes = [key async for key in redis.scan_iter(f"{prefix}:*")
                   if await redis.type(key) == b"zset"]
        assert len(indexes) >= 3  # everyone's, and busy's with each of its flows
        for key in indexes:
            members = await redis.zrange(key, 0, -1)
            assert len(members) <= 5, key
            for member in members:  # every id names a live run
                assert await redis.exists(f"{prefix}:run:{member.decode()}"), (key, member)
            assert 0 < await redis.ttl(key) <= 3600, key
        assert len([key async for key in redis.scan_iter(f"{prefix}:run:*")]) == 5
        listed, _ = await store.page(RunQuery(caller="busy"))
        assert len(listed) == 5
    finally:
        await redis.aclose()
        await store.close()


@pytest.mark.anyio
async def test_a_record_saved_again_as_another_callers_is_filed_as_theirs() -> None:
    store = MemoryRunStore(max_runs=3, max_age=3600)
    first = record("x")
    await store.save(first, new=True)
    moved = RunRecord(first.run_id, "g", "1.0.0", "g", "y", first.seq, first.started_at)
    await store.save(moved)
    assert (await store.page(RunQuery(caller="x")))[0] == []
    assert await store.get(first.run_id, caller="x") is None
    assert [r.run_id for r in (await store.page(RunQuery(caller="y", flow="g")))[0]] == \
        [first.run_id]
    for _ in range(5):  # retention still finds every run it counts
        await store.save(record("x"), new=True)
    assert len((await store.page(RunQuery()))[0]) == 3
