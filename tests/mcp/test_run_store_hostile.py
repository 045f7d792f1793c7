"""Run history entries in Redis that cannot be trusted: records damaged, edited by hand or
written by another release (a field of the wrong type, a status this release does not
know, a record filed under another run's id, not JSON at all, nested too deep) and index
members that name no run (not UTF-8, not a run id, a score that is not a time). Each
answers its caller exactly like a run that never existed, through a real MCP client on
both eras; the caller's listing shows its readable runs and never fails for a bad one;
the server logs one warning, never a traceback or -32603; the operator's ``chainweaver
runs`` lists the rest and says "no such run" for a damaged one (the second adversarial
pass of issue 32)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from fastmcp import Client
from support.run_records import run_catalogue
from support.views import answer, renamed

from chainweaver.mcp import CallerIdentity, FlowServer, SecurityConfig, ServingConfig
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.runs.records import RunQuery
from chainweaver.mcp.runs.redis_records import RedisRunStore

pytestmark = [pytest.mark.slow, pytest.mark.tasks, pytest.mark.anyio]

CALLER = "owner"
NEVER = "0" * 24


def damaged(good: dict[str, Any]) -> dict[str, str]:
    """Stored bodies a record may hold, each unreadable by this release."""
    bodies = {name: {**good, **change} for name, change in {
        "started_at_text": {"started_at": "soon"},
        "started_at_nan": {"started_at": float("nan")},
        "seq_text": {"seq": "x"},
        "seq_negative": {"seq": -5},
        "flow_list": {"flow": ["flow1"]},
        "caller_number": {"caller": 5},
        "status_unknown": {"status": "exploded"},
        "steps_text": {"steps": "abc"},
        "steps_of_text": {"steps": ["abc"]},
        "approvals_number": {"approvals": 5},
        "output_size_text": {"output_size": "big", "output_stored": True},
        "output_stored_text": {"output_stored": "yes"},
        "deliveries_bool": {"deliveries": True},
        "another_runs_record": {"run_id": "f" * 24},
    }.items()}
    texts = {name: json.dumps(body) for name, body in bodies.items()}
    texts["not_json"] = "{oops"
    texts["a_list"] = "[1, 2]"
    texts["nested_too_deep"] = "[" * 100_000 + "]" * 100_000
    texts["no_run_id"] = json.dumps({k: v for k, v in good.items() if k != "run_id"})
    return texts


@pytest.fixture
def prefix() -> str:
    return f"hostile:{time.time_ns()}"


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def server(redis_url: str, prefix: str) -> AsyncIterator[FlowServer]:
    flow_server = FlowServer(run_catalogue(), security=SecurityConfig(
        authenticator=lambda ctx: CallerIdentity(CALLER)), serving=ServingConfig(
        run_history=RunHistory(store=redis_url, prefix=prefix, output_limit=10)))
    yield flow_server
    await flow_server.run_store.close()  # type: ignore[union-attr]


def plant(raw: redis.Redis, prefix: str, good: dict[str, Any]) -> dict[str, str]:
    """Each damaged body under a run id of its own, filed in the caller's indexes."""
    planted = {}
    for number, (name, body) in enumerate(damaged(good).items(), start=1):
        run_id = f"{number:024x}"
        raw.set(f"{prefix}:run:{run_id}", body)
        raw.set(f"{prefix}:out:{run_id}", b"\xff\xfe not the output")
        for index in ("all", f"caller:{CALLER}", f"caller:{CALLER}:flow:flow1"):
            raw.zadd(f"{prefix}:{index}", {run_id: good["seq"] + number})
        planted[name] = run_id
    return planted


def foreign_members(raw: redis.Redis, prefix: str, seq: int) -> None:
    """Index members that name no run: not UTF-8, not a run id, an infinite score."""
    for index in ("all", f"caller:{CALLER}"):
        raw.zadd(f"{prefix}:{index}", {b"\xff\xfe": seq + 500, "../../x": seq + 501,
                                       "e" * 24: float("inf"), "d" * 24: float("-inf")})


async def never_existed(client: Client, uri: str) -> dict[str, Any]:
    """The answer to ``uri``, as it would read about a run id that never existed."""
    run_id = uri.split("/")[3]
    return renamed(await answer(lambda: client.session.read_resource(uri)), run_id, NEVER)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_unreadable_run_record_answers_like_a_run_that_never_existed(
        server: FlowServer, raw: redis.Redis, prefix: str, mode: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with Client(server.fastmcp, mode=mode) as client:
        called = await client.session.call_tool("flow1", {"text": "a long enough output"})
        good_id = called.meta["chainweaver"]["run_id"]
        good = json.loads(raw.get(f"{prefix}:run:{good_id}"))
        planted = plant(raw, prefix, good)
        foreign_members(raw, prefix, good["seq"])
        unknown = {kind: await answer(lambda kind=kind: client.session.read_resource(
            f"chainweaver://runs/{NEVER}{kind}")) for kind in ("", "/output")}
        for name, run_id in planted.items():
            for kind in ("", "/output"):
                uri = f"chainweaver://runs/{run_id}{kind}"
                assert await never_existed(client, uri) == unknown[kind], (name, kind)
        for query in ("", "?flow=flow1", "?limit=1", "?status=completed"):
            listed = json.loads((await client.read_resource(
                f"chainweaver://runs{query}"))[0].text)
            assert [run["run_id"] for run in listed["runs"]] == [good_id], query
        # The readable run reads as before.
        record = json.loads((await client.read_resource(
            f"chainweaver://runs/{good_id}"))[0].text)
        assert record["status"] == "completed"
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("cannot be read and is skipped" in r.getMessage() for r in caplog.records)


async def test_the_store_skips_what_it_cannot_read_listing_reading_and_retaining(
        redis_url: str, raw: redis.Redis, prefix: str) -> None:
    """Directly on the store: the operator's listing (every caller's, the ``all``
    index) and retention, which reads the records it evicts."""
    store = RedisRunStore(redis_url, prefix=prefix, max_runs=1000)
    try:
        now = time.time()
        good = {"run_id": "a" * 24, "flow": "flow1", "version": "1.0.0", "tool": "flow1",
                "caller": CALLER, "seq": int(now * 1e6), "started_at": now,
                "status": "completed"}
        raw.set(f"{prefix}:run:{'a' * 24}", json.dumps(good))
        raw.zadd(f"{prefix}:all", {"a" * 24: good["seq"]})
        planted = plant(raw, prefix, good)
        foreign_members(raw, prefix, good["seq"])
        everyone, cursor = await store.page(RunQuery(limit=100))
        assert [r.run_id for r in everyone] == ["a" * 24] and cursor is None
        for run_id in planted.values():
            assert await store.get(run_id) is None
            assert await store.output(run_id, caller=CALLER) is None
        # Retention pops the oldest ids, the unreadable ones among them: no failure.
        store.max_runs = 1
        await store.save(store_record(now), new=True)
        assert await store.get("b" * 24) is not None
    finally:
        await store.close()


def store_record(now: float) -> Any:
    from chainweaver.mcp.runs.records import RunRecord

    return RunRecord("b" * 24, "flow1", "1.0.0", "flow1", CALLER, int(now * 1e6) + 10**6,
                     now)
