"""Under load: 4 clients (two of each era, in memory) list, call, read and render
without pause while flows are archived, re-registered and promoted 30 times.

Zero errors but not-found for flows already retired; zero calls served for a flow
that started after its retirement returned and before its promotion began; every
call that ran wholly while its flow was active served; every client told of every
change to its tools list; memory flat.

No step here depends on how fast the machine is: each change waits until every
client was told of it and until each primitive of the changed flow has been tried
wholly inside the new state, so every window is exercised however slow the run. How
fast the server answers and notifies under churn is measured in
``benchmarks/bench_rebuild.py``, not asserted here.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from mcp import MCPError
from mcp.client.subscriptions import listen

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowLifecycle,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import FlowServer, ServingConfig, schema_uri

pytestmark = pytest.mark.anyio

CHURN = [f"churn_{index}" for index in range(4)]
KINDS = ("call", "read", "render")
CLIENTS = 4  # slots 0-1 speak 2025-11-25 (legacy), 2-3 2026-07-28 (listen streams)
CYCLES = 30
WARM_UP = 10  # cycles before memory is measured: caches fill, then stay the same size
HANG = 120.0  # seconds: only to stop a hang, never a measure of speed
# Bytes over the 20 measured cycles (about 1,000 requests, every one of them traced,
# which slows each allocation several times): a leak of 128 bytes a request shows.
MEMORY_TOLERANCE = 128 * 1024
# Allocations of the test harness, not of the server or its clients.
HARNESS = ("*/_pytest/*", "*/pluggy/*", "*/logging/*", "*/warnings.py", "*/linecache.py",
           "*/traceback.py")
INF = float("inf")


@tool(safety=ToolSafetyContract("read"))
def look(text: str) -> dict:
    """Look."""
    return {"text": text}


def churn_flow(name: str, lifecycle: FlowLifecycle) -> Flow:
    return Flow(name, f"Churning flow {name}.", [FlowStep("look")],
                governance=FlowGovernance(lifecycle))


class Record:
    def __init__(self) -> None:
        # Per flow: [archive returned, promotion began] (it must be absent throughout)
        # and [promotion returned, next archive began] (it must be present throughout).
        self.retired: dict[str, list[list[float]]] = {name: [] for name in CHURN}
        self.live: dict[str, list[list[float]]] = {name: [[0.0, INF]] for name in CHURN}
        self.changes: list[float] = []  # when each change to the tools list returned
        self.errors: list[str] = []  # anything but not-found
        # (flow, primitive, started, returned, served) for every call, read and render,
        # appended in the order they returned
        self.outcomes: list[tuple[str, str, float, float, bool]] = []
        self.notices: list[list[float]] = [[] for _ in range(CLIENTS)]
        # For each wait in change_flows: whether the flow should serve, and whether the
        # first call, read and render that ran wholly inside that state were served.
        self.witnesses: list[tuple[bool, dict[str, bool]]] = []

    def within(self, windows: list[list[float]], started: float, ended: float) -> bool:
        return any(begin <= started and ended < end for begin, end in windows)


async def until(done: Callable[[], bool], what: Callable[[], str]) -> None:
    """Wait for an observable state of the run (polling; the clients run meanwhile)."""
    deadline = time.monotonic() + HANG
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"hung waiting for {what()}")
        await asyncio.sleep(0.005)


async def every_client_told(record: Record, change: float) -> None:
    """Until every client heard of the tools list changing after ``change``. Waiting for
    this before the next change also keeps changes from merging into one notice."""
    def untold() -> list[int]:
        return [slot for slot, times in enumerate(record.notices)
                if not times or times[-1] < change]
    await until(lambda: not untold(), lambda: f"notices of the change at {change} to "
                f"clients {untold()}")


def each_kind_tried(record: Record, name: str, since: float,
                    serves: bool) -> Awaitable[None]:
    """Waits until a call, a read and a render of ``name`` each started after ``since``
    and returned: each ran wholly inside the state the flow has been in since then (the
    caller makes no change before the wait ends). Records whether the first of each was
    served. Called right after taking ``since``, with no await in between: outcomes are
    appended as they return, so none already in the list started after ``since``."""
    seen = len(record.outcomes)
    found: dict[str, bool] = {}

    def all_tried() -> bool:
        nonlocal seen
        for flow, kind, started, _, served in record.outcomes[seen:]:
            if flow == name and started >= since:
                found.setdefault(kind, served)
        seen = len(record.outcomes)
        return found.keys() == set(KINDS)

    async def wait() -> None:
        await until(all_tried, lambda: f"{name}: only {sorted(found)} tried since {since}")
        record.witnesses.append((serves, found))
    return wait()


class Pause:
    """Holds the clients between two rounds of requests, so memory is measured with no
    request in flight (in-flight requests are not growth)."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.go.set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.busy = 0

    def enter(self) -> None:
        self.busy += 1
        self.idle.clear()

    def leave(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self.idle.set()

    async def quiet(self) -> None:
        self.go.clear()  # no client starts a round after this (no await in between)
        await asyncio.wait_for(self.idle.wait(), HANG)


async def client_loop(client: Client, record: Record, done: asyncio.Event, offset: int,
                      pause: Pause) -> None:
    for index in range(10_000_000):  # bounded; ends when the changes are done
        await asyncio.wait_for(pause.go.wait(), HANG)
        if done.is_set():
            return
        pause.enter()
        try:
            await one_round(client, record, CHURN[(index + offset) % len(CHURN)])
        finally:
            pause.leave()


async def one_round(client: Client, record: Record, name: str) -> None:
    """List, then call, read and render ``name``, recording each outcome."""
    await client.list_tools()
    for kind, not_found in (("call", f"Unknown tool: '{name}'"),
                            ("read", f"Resource not found: '{schema_uri(name)}'"),
                            ("render", f"Unknown prompt: '{name}'")):
        started = time.monotonic()
        try:
            await request(client, kind, name)
            served = True
        except (MCPError, ToolError) as error:
            message = error.error.message if isinstance(error, MCPError) else str(error)
            if message != not_found:
                record.errors.append(f"{kind} {name}: {message}")
            served = False
        record.outcomes.append((name, kind, started, time.monotonic(), served))


async def request(client: Client, kind: str, name: str) -> None:
    if kind == "call":  # a tool's isError result raises ToolError
        await client.call_tool(name, {"text": "x"})
    elif kind == "read":
        await client.read_resource(schema_uri(name))
    else:
        await client.get_prompt(name, {"text": "x"})


async def change_flows(registry: FlowRegistry, record: Record,
                       measure: Callable[[], Awaitable[None]]) -> None:
    for cycle in range(CYCLES):
        if cycle == WARM_UP:
            await measure()
        name = CHURN[cycle % len(CHURN)]
        record.live[name][-1][1] = time.monotonic()  # retirement begins
        registry.set_lifecycle(name, "archived")
        now = time.monotonic()
        record.retired[name].append([now, INF])
        record.changes.append(now)
        await asyncio.gather(every_client_told(record, now),
                             each_kind_tried(record, name, now, False))  # archived
        registry.unregister(name)  # re-registered as a draft: still hidden
        registry.register_flow(churn_flow(name, FlowLifecycle.DRAFT))
        registry.set_lifecycle(name, "reviewed")
        await each_kind_tried(record, name, time.monotonic(), False)  # reviewed: hidden
        record.retired[name][-1][1] = time.monotonic()  # promotion begins
        registry.set_lifecycle(name, "active")
        now = time.monotonic()
        record.live[name].append([now, INF])
        record.changes.append(now)
        await asyncio.gather(every_client_told(record, now),
                             each_kind_tried(record, name, now, True))  # active again


async def test_clients_under_load_while_flows_change(caplog: pytest.LogCaptureFixture
                                                     ) -> None:
    # Each change logs why a flow is not exposed; kept log records would count as growth.
    caplog.set_level(logging.ERROR, logger="chainweaver")
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(look)
    for name in CHURN:
        registry.register_flow(churn_flow(name, FlowLifecycle.ACTIVE))
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        serving=ServingConfig(change_debounce=0.05))
    record = Record()
    done = asyncio.Event()
    memory: list[tracemalloc.Snapshot] = []
    pause = Pause()

    async def measure() -> None:
        await pause.quiet()
        # Everything allocated, but by this test's own records of what happened and by
        # the test harness (pytest's captures, warning registries, tracebacks it keeps).
        gc.collect()
        memory.append(tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, __file__), tracemalloc.Filter(False, tracemalloc.__file__),
             *(tracemalloc.Filter(False, pattern) for pattern in HARNESS)]))
        pause.go.set()

    def heard(slot: int) -> Callable[[Any], Any]:
        async def handler(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                record.notices[slot].append(time.monotonic())
        return handler

    async def stream(client: Client, slot: int, listening: asyncio.Event) -> None:
        # listen() returns once the server acknowledged the stream.
        async with listen(client.session, tools_list_changed=True) as events:
            listening.set()
            async for _ in events:
                record.notices[slot].append(time.monotonic())

    # Runs log each step at INFO, and pytest keeps every captured record in memory:
    # that would be the test's growth, not the server's.
    logging.disable(logging.INFO)
    tracemalloc.start()
    try:
        async with AsyncExitStack() as stack:
            clients = []
            for slot in range(CLIENTS):
                mode = "legacy" if slot < CLIENTS // 2 else "auto"
                handler = heard(slot) if mode == "legacy" else None
                client = await stack.enter_async_context(
                    Client(server.fastmcp, mode=mode, message_handler=handler))
                await client.list_tools()  # the server now knows this session
                clients.append(client)
            listening = {slot: asyncio.Event() for slot in range(CLIENTS // 2, CLIENTS)}
            listeners = [asyncio.create_task(stream(clients[slot], slot, event))
                         for slot, event in listening.items()]
            for event in listening.values():  # every stream acknowledged: none misses a change
                await asyncio.wait_for(event.wait(), HANG)
            loops = [asyncio.create_task(client_loop(client, record, done, slot, pause))
                     for slot, client in enumerate(clients)]
            await change_flows(registry, record, measure)
            await measure()
            done.set()
            await asyncio.wait_for(asyncio.gather(*loops), HANG)
            for listener in listeners:
                listener.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)

    assert record.errors == []
    # A request that started after a retirement returned and returned before the
    # promotion began could only have been served by a retired flow; one that ran
    # wholly while the flow was active must have been served.
    leaked = [o for o in record.outcomes if o[4] and record.within(record.retired[o[0]],
                                                                  o[2], o[3])]
    missed = [o for o in record.outcomes if not o[4] and record.within(record.live[o[0]],
                                                                      o[2], o[3])]
    assert leaked == [] and missed == []
    # Not vacuous: change_flows waited for a call, a read and a render to run wholly
    # inside every retired window (archived, then draft/reviewed) and every live window
    # after a promotion, so each window had requests to check.
    assert len(record.witnesses) == 3 * CYCLES
    assert [found for _, found in record.witnesses] == [
        {kind: serves for kind in KINDS} for serves, _ in record.witnesses]
    for slot, times in enumerate(record.notices):
        for change in record.changes:
            assert any(t >= change for t in times), (
                f"client {slot} was not told of the change at {change}")
    changes = memory[1].compare_to(memory[0], "filename")
    growth = sum(change.size_diff for change in changes)
    assert growth < MEMORY_TOLERANCE, [str(change) for change in changes[:8]]
    served_count = sum(o[4] for o in record.outcomes)
    print(f"\nrequests {len(record.outcomes)}, served {served_count}, "
          f"memory growth {growth} B")
