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
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
from fastmcp import Client
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


@tool(safety=ToolSafetyContract("read"))
def look(text: str) -> dict:
    """Look."""
    return {"text": text}


def churn_flow(name: str, lifecycle: FlowLifecycle) -> Flow:
    return Flow(name, f"Churning flow {name}.", [FlowStep("look")],
                governance=FlowGovernance(lifecycle))


class Record:
    def __init__(self) -> None:
        self.retired: dict[str, list[list[float]]] = {name: [] for name in CHURN}
        self.changes: list[float] = []  # when each change to the tools list returned
        self.errors: list[str] = []
        # (flow, when the call started, when it returned) for every call served
        self.served: list[tuple[str, float, float]] = []
        self.requests = 0

    def unexpected(self, name: str, message: str, expected: str) -> None:
        if message != expected:
            self.errors.append(f"{name}: {message}")


async def client_loop(client: Client, record: Record, done: asyncio.Event, offset: int
                      ) -> None:
    for index in range(100_000):  # bounded; ends when the changes are done
        if done.is_set():
            return
        name = CHURN[(index + offset) % len(CHURN)]
        await client.list_tools()
        started = time.monotonic()
        called = await client.call_tool(name, {"text": "x"}, raise_on_error=False)
        if called.is_error:
            record.unexpected(name, called.content[0].text, f"Unknown tool: '{name}'")
        else:
            record.served.append((name, started, time.monotonic()))
        for attempt, expected in (
                (client.read_resource(schema_uri(name)),
                 f"Resource not found: '{schema_uri(name)}'"),
                (client.get_prompt(name, {"text": "x"}), f"Unknown prompt: '{name}'")):
            try:
                await attempt
            except MCPError as error:
                record.unexpected(name, error.error.message, expected)
        record.requests += 4


async def change_flows(registry: FlowRegistry, record: Record,
                       measure: Callable[[], None]) -> None:
    for cycle in range(CYCLES):
        if cycle == WARM_UP:
            measure()
        name = CHURN[cycle % len(CHURN)]
        registry.set_lifecycle(name, "archived")
        now = time.monotonic()
        record.retired[name].append([now, float("inf")])
        record.changes.append(now)
        await asyncio.sleep(SPACING)
        registry.unregister(name)  # re-registered as a draft: still hidden
        registry.register_flow(churn_flow(name, FlowLifecycle.DRAFT))
        registry.set_lifecycle(name, "reviewed")
        await asyncio.sleep(0.01)
        record.retired[name][-1][1] = time.monotonic()  # promotion begins
        registry.set_lifecycle(name, "active")
        record.changes.append(time.monotonic())
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
    memory: list[int] = []

    def measure() -> None:
        gc.collect()
        memory.append(tracemalloc.get_traced_memory()[0])

    def heard(slot: int) -> Callable[[Any], Any]:
        async def handler(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                notices[slot].append(time.monotonic())
        return handler

    async def stream(client: Client, slot: int) -> None:
        async with listen(client.session, tools_list_changed=True) as events:
            async for _ in events:
                notices[slot].append(time.monotonic())

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
            loops = [asyncio.create_task(client_loop(client, record, done, slot))
                     for slot, client in enumerate(clients)]
            await asyncio.sleep(0.2)  # the listen streams are acknowledged
            await change_flows(registry, record, measure)
            await asyncio.sleep(NOTICE_BOUND)  # the last notices arrive
            measure()
            done.set()
            await asyncio.wait_for(asyncio.gather(*loops), 60)
            for listener in listeners:
                listener.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
    finally:
        tracemalloc.stop()

    assert record.errors == []
    assert record.requests > 1000
    # A call that started after a retirement returned and returned before the
    # promotion began was served by nothing but a retired flow.
    late = [(name, started) for name, started, ended in record.served
            if any(begin <= started and ended < end for begin, end in record.retired[name])]
    assert late == []
    delays = []
    for slot, times in enumerate(notices):
        for change in record.changes:
            following = [t for t in times if t >= change]
            assert following, f"client {slot} was not told of the change at {change}"
            delays.append(following[0] - change)
    assert len(delays) == 8 * 2 * CYCLES
    assert max(delays) < NOTICE_BOUND, max(delays)
    growth = memory[1] - memory[0]
    assert growth < MEMORY_TOLERANCE, growth
    print(f"\nrequests {record.requests}, served {len(record.served)}, "
          f"max notice delay {max(delays) * 1000:.0f} ms, memory growth {growth} B")
