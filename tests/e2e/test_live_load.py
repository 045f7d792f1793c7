"""Under load: 8 clients (both eras, in memory) list, call, read and render without
pause while flows are archived, re-registered and promoted 100 times.

Zero errors but not-found for flows already retired; zero calls served for a flow
that started after its retirement returned and before its promotion began; every
client told of every change to its tools list within 1 s; memory flat.
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
CYCLES = 100
WARM_UP = 10  # cycles before memory is measured: caches fill, then stay the same size
SPACING = 0.12  # seconds between visible changes: longer than the debounce (0.05)
NOTICE_BOUND = 1.0  # the bound on telling every client
MEMORY_TOLERANCE = 512 * 1024  # bytes
# Allocations of the test harness, not of the server or its clients.
HARNESS = ("*/_pytest/*", "*/pluggy/*", "*/logging/*", "*/warnings.py", "*/linecache.py",
           "*/traceback.py")


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
        # (flow, primitive, started, returned, served) for every call, read and render
        self.outcomes: list[tuple[str, str, float, float, bool]] = []

    def within(self, windows: list[list[float]], started: float, ended: float) -> bool:
        return any(begin <= started and ended < end for begin, end in windows)


INF = float("inf")


class Pause:
    """Holds the clients between two rounds of requests, so memory is measured with no
    request in flight (in-flight requests are not growth)."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.go.set()
        self.busy = 0

    async def quiet(self) -> None:
        self.go.clear()
        for _ in range(1000):  # bounded: a round of requests takes milliseconds
            if self.busy == 0:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the clients did not pause")


async def client_loop(client: Client, record: Record, done: asyncio.Event, offset: int,
                      pause: Pause) -> None:
    for index in range(100_000):  # bounded; ends when the changes are done
        await asyncio.wait_for(pause.go.wait(), 60)
        if done.is_set():
            return
        pause.busy += 1
        try:
            await one_round(client, record, CHURN[(index + offset) % len(CHURN)])
        finally:
            pause.busy -= 1


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
        await asyncio.sleep(SPACING)
        registry.unregister(name)  # re-registered as a draft: still hidden
        registry.register_flow(churn_flow(name, FlowLifecycle.DRAFT))
        registry.set_lifecycle(name, "reviewed")
        await asyncio.sleep(0.01)
        record.retired[name][-1][1] = time.monotonic()  # promotion begins
        registry.set_lifecycle(name, "active")
        now = time.monotonic()
        record.live[name].append([now, INF])
        record.changes.append(now)
        await asyncio.sleep(SPACING)


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
    notices: list[list[float]] = [[] for _ in range(8)]
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
                notices[slot].append(time.monotonic())
        return handler

    async def stream(client: Client, slot: int) -> None:
        async with listen(client.session, tools_list_changed=True) as events:
            async for _ in events:
                notices[slot].append(time.monotonic())

    # Runs log each step at INFO, and pytest keeps every captured record in memory:
    # that would be the test's growth, not the server's.
    logging.disable(logging.INFO)
    tracemalloc.start()
    try:
        async with AsyncExitStack() as stack:
            clients = []
            for slot in range(8):
                mode = "legacy" if slot < 4 else "auto"
                handler = heard(slot) if mode == "legacy" else None
                clients.append(await stack.enter_async_context(
                    Client(server.fastmcp, mode=mode, message_handler=handler)))
            listeners = [asyncio.create_task(stream(clients[slot], slot))
                         for slot in range(4, 8)]
            loops = [asyncio.create_task(client_loop(client, record, done, slot, pause))
                     for slot, client in enumerate(clients)]
            await asyncio.sleep(0.2)  # the listen streams are acknowledged
            await change_flows(registry, record, measure)
            await asyncio.sleep(NOTICE_BOUND)  # the last notices arrive
            await measure()
            done.set()
            await asyncio.wait_for(asyncio.gather(*loops), 60)
            for listener in listeners:
                listener.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)

    assert record.errors == []
    assert len(record.outcomes) > 1000
    # A request that started after a retirement returned and returned before the
    # promotion began could only have been served by a retired flow; one that ran
    # wholly while the flow was active must have been served.
    leaked = [o for o in record.outcomes if o[4] and record.within(record.retired[o[0]],
                                                                  o[2], o[3])]
    missed = [o for o in record.outcomes if not o[4] and record.within(record.live[o[0]],
                                                                      o[2], o[3])]
    assert leaked == [] and missed == []
    assert any(o[4] for o in record.outcomes) and not all(o[4] for o in record.outcomes)
    delays = []
    for slot, times in enumerate(notices):
        for change in record.changes:
            following = [t for t in times if t >= change]
            assert following, f"client {slot} was not told of the change at {change}"
            delays.append(following[0] - change)
    assert len(delays) == 8 * 2 * CYCLES
    assert max(delays) < NOTICE_BOUND, max(delays)
    changes = memory[1].compare_to(memory[0], "filename")
    growth = sum(change.size_diff for change in changes)
    assert growth < MEMORY_TOLERANCE, [str(change) for change in changes[:8]]
    served = sum(o[4] for o in record.outcomes)
    print(f"\nrequests {len(record.outcomes)}, served {served}, "
          f"max notice delay {max(delays) * 1000:.0f} ms, memory growth {growth} B")
