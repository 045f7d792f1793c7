"""What a task leg asks of a real Redis, counted with ``MONITOR`` on a private server:
each checkpoint of a step is one round trip (the entry and its expiry in one
transaction), and everything the leg does before its first step (its delivery count,
its markers, the status "running" and the one read of the run's checkpoints) is one.

A round trip here is one ``MULTI`` ... ``EXEC`` block, or one command outside a block:
what one connection sends before it waits for the answer.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import pytest
import redis.asyncio as redis
from fastmcp import Client
from fastmcp_tasks import call_tool_task
from pydantic import BaseModel
from support.redis_server import redis_server

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import ExposurePolicy, FlowServer, TaskSettings

pytestmark = [pytest.mark.slow, pytest.mark.tasks]

LIMIT = 30.0  # seconds: only stops a hang
# A leg's start: its delivery count and expiry, heartbeat and leg markers, the status
# "running" (the progress hash and its event), and the run's checkpoints.
LEG_START = ["HINCRBY", "EXPIRE", "SET", "SET", "HSET", "PUBLISH", "HGETALL"]
READ = ToolSafetyContract(SideEffectLevel.READ)
WRITE = ToolSafetyContract(SideEffectLevel.WRITE, idempotent=False)


class Number(BaseModel):
    n: int


@tool(safety=READ)
async def rt_first(n: int) -> Number:
    """First step."""
    return Number(n=n + 1)


@tool(safety=READ)
async def rt_second(n: int) -> Number:
    """Second step."""
    return Number(n=n * 2)


@tool(safety=WRITE)
async def rt_charge(n: int) -> Number:
    """A step that must not run twice (marked before it runs)."""
    return Number(n=n - 1)


@pytest.fixture(scope="module")
def private_redis() -> Iterator[str]:
    # A server of its own: MONITOR sees only what this file's tasks send.
    with redis_server() as url:
        yield url


def build(url: str) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    for step in (rt_first, rt_second, rt_charge):
        executor.register_tool(step)
    executor.registry.register_flow(Flow("three_reads", "d", [
        FlowStep("rt_first", id="one"), FlowStep("rt_second"),
        FlowStep("rt_first", id="three")]))
    executor.registry.register_flow(Flow("read_then_charge", "d", [
        FlowStep("rt_first"), FlowStep("rt_charge")]))
    return FlowServer(executor, tasks=TaskSettings(url=url, name=f"rt-{secrets.token_hex(4)}"),
                      policy=ExposurePolicy(allowed_side_effects=["read", "write"]))


async def monitored(url: str, flow: str) -> list[tuple[str, list[str]]]:
    """Run ``flow`` as a task to its end; every command Redis saw meanwhile, as
    (client, words), in order."""
    seen: list[tuple[str, list[str]]] = []
    ready = asyncio.Event()
    watcher = redis.Redis.from_url(url)

    async def watch() -> None:
        async with watcher.monitor() as monitor:
            ready.set()
            async for command in monitor.listen():
                client = f"{command.get('client_address')}:{command.get('client_port')}"
                seen.append((client, command["command"].split(" ")))

    watching = asyncio.ensure_future(watch())
    try:
        await asyncio.wait_for(ready.wait(), LIMIT)
        async with Client(build(url).fastmcp) as client:
            task = await call_tool_task(client, flow, {"n": 1})
            result = await asyncio.wait_for(task.result(), LIMIT)
            assert result.is_error is False
            await asyncio.sleep(0.2)  # MONITOR's stream trails the commands a little
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await watcher.aclose()
    return seen


def round_trips(seen: list[tuple[str, list[str]]], marker: str) -> list[list[str]]:
    """The round trips that touch a key containing ``marker``: one MULTI..EXEC block
    (its commands, in order), or one command."""
    blocks: list[list[str]] = []
    open_blocks: dict[str, list[list[str]]] = {}
    for client, words in seen:
        name = words[0].strip('"').upper()
        if name == "MULTI":
            open_blocks[client] = []
            continue
        if name == "EXEC":
            block = open_blocks.pop(client, [])
            if any(marker in " ".join(words) for words in block):
                blocks.append([w[0].strip('"').upper() for w in block])
            continue
        if client in open_blocks:
            open_blocks[client].append(words)
        elif marker in " ".join(words):
            blocks.append([name])
    return blocks


@pytest.mark.anyio
async def test_each_checkpoint_of_a_step_is_one_round_trip(private_redis: str) -> None:
    seen = await monitored(private_redis, "three_reads")
    trips = round_trips(seen, "chainweaver:checkpoints:")
    # Read once, with the leg's start; then one transaction per step: the step's entry
    # (the run's head rides with the first) and the hash's expiry.
    assert trips == [LEG_START] + [["HSET", "EXPIRE"]] * 3


@pytest.mark.anyio
async def test_a_step_that_must_not_run_twice_is_marked_before_it_runs(
        private_redis: str) -> None:
    seen = await monitored(private_redis, "read_then_charge")
    trips = round_trips(seen, "chainweaver:checkpoints:")
    # The marker of the non-idempotent step is its own round trip: it must be stored
    # before the side effect, so a redelivered run knows the step may have run.
    assert trips == [LEG_START, ["HSET", "EXPIRE"], ["HSET", "EXPIRE"],
                     ["HSET", "EXPIRE"]]


@pytest.mark.anyio
async def test_a_legs_markers_start_in_one_round_trip(private_redis: str) -> None:
    seen = await monitored(private_redis, "three_reads")
    # (tasks/get reads the heartbeat too: only the leg's writes are counted)
    trips = [trip for trip in round_trips(seen, "chainweaver:task-")
             if trip != ["EXISTS"]]
    # The leg's start (its delivery count and both markers, with its status and the
    # checkpoint read), and the markers' removal at the end: the heartbeat renews only
    # after its first interval (a short leg never).
    assert trips == [LEG_START, ["DEL"]]


@pytest.mark.anyio
async def test_a_status_is_one_round_trip_of_plain_commands(private_redis: str) -> None:
    seen = await monitored(private_redis, "three_reads")
    writes = [trip for trip in round_trips(seen, ":progress:") if "PUBLISH" in trip]
    # "running" rides with the leg's start; each later status is its own hash write and
    # event (no script): steps that start while one is written collapse into the last.
    assert writes[0] == LEG_START
    assert all(trip == ["HSET", "PUBLISH"] for trip in writes[1:])
    assert 1 <= len(writes[1:]) <= 3
