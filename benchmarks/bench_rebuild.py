"""Snapshot rebuilds: what a registry change costs, and whether it stalls requests.

1. Rebuild time at each catalogue size (default 1,000 and 20,000 flows, tools only):
   - baseline: deciding every flow from scratch (what a restart does, ``Exposure(...)
     .catalogue`` over a fresh registry state);
   - the swap: ``FlowRegistry.set_lifecycle`` returning with a FlowServer following
     (a new snapshot built and swapped in, inside the change);
   - the full rebuild: the new snapshot's catalogue (every flow decided; unchanged
     ones carried over), which the notifier computes off the event loop.
2. Requests during rebuilds, at the largest size: 8 in-memory clients call a tool and
   read its schema without pause; rounds alternate between quiet and a registry
   change every 50 ms (each a swap plus a full rebuild in a worker thread, as when
   serving). Reported: p50 / p99 latency of each, and the p99 ratio.

Run: ``python benchmarks/bench_rebuild.py [--sizes N,N] [--requests N] [--rounds N]
[--quick]``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import statistics
import threading
import time

from bench_common import ignore_log
from bench_server import build_executor, fmt
from fastmcp import Client

from chainweaver.mcp import ExposurePolicy, FlowServer
from chainweaver.mcp.publish.exposure import Exposure

CLIENTS = 8


def best(samples: list[float]) -> float:
    return min(samples)


def bench_rebuild(size: int, repeats: int) -> None:
    executor = build_executor(size)
    policy = ExposurePolicy()
    scratch: list[float] = []
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        Exposure(executor, policy).catalogue  # noqa: B018
        scratch.append(time.perf_counter() - started)
    server = FlowServer(executor)
    server.exposure_report()  # the serving snapshot has decided every flow
    swaps: list[float] = []
    rebuilds: list[float] = []
    for index in range(repeats):
        name = f"classify_{index:04d}"
        gc.collect()
        started = time.perf_counter()
        executor.registry.set_lifecycle(name, "archived")
        swapped = time.perf_counter()
        server.exposure_report()  # the new snapshot's catalogue
        rebuilt = time.perf_counter()
        swaps.append(swapped - started)
        rebuilds.append(rebuilt - swapped)
    base = best(scratch)
    print(f"  {size:>6} flows  from scratch {fmt(base)}   swap {fmt(best(swaps))} "
          f"({best(swaps) / base:6.3f}x)   full rebuild {fmt(best(rebuilds))} "
          f"({best(rebuilds) / base:6.3f}x)", flush=True)



async def drive(clients: list[Client], requests: int) -> list[float]:
    """``requests`` calls and reads spread over the clients; per-request seconds."""
    latencies: list[float] = []

    async def one(client: Client, count: int) -> None:
        for index in range(count):
            name = f"classify_{(index % 50) + 100:04d}"
            started = time.perf_counter()
            if index % 2:
                await client.session.read_resource(f"chainweaver://flows/{name}/schema")
            else:
                await client.session.call_tool(name, {"text": "Hello There"})
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one(c, requests // len(clients)) for c in clients))
    return latencies


def churn(server: FlowServer, first: int, stop: threading.Event, changed: list[int]
          ) -> None:
    """A registry change every 50 ms, each followed by a full rebuild (as the notifier
    does it: in a worker thread), archiving classify_<first> onwards."""
    registry = server.executor.registry
    while not stop.wait(0.05):
        registry.set_lifecycle(f"classify_{first + changed[0]:04d}", "archived")
        server.exposure_report()
        changed[0] += 1


async def bench_requests(size: int, requests: int, rounds: int) -> None:
    server = FlowServer(build_executor(size), expose_schemas=True)
    server.exposure_report()
    results: dict[str, list[float]] = {"quiet": [], "during rebuilds": []}
    clients = [Client(server.fastmcp, log_handler=ignore_log) for _ in range(CLIENTS)]
    changes = 0
    for client in clients:
        await client.__aenter__()
        # The MCP SDK's client lists every tool on its first call (to check output
        # schemas): the client's cost, once, so not measured.
        await client.session.call_tool("classify_0100", {"text": "Hello There"})
    try:
        for round_index in range(rounds):
            for label in ("quiet", "during rebuilds"):
                stop = threading.Event()
                changed = [0]
                # Requests use classify_0100..0149; each round archives other flows.
                thread = threading.Thread(target=churn, args=(
                    server, 200 + round_index * 200, stop, changed))
                if label == "during rebuilds":
                    thread.start()
                results[label].extend(await drive(clients, requests))
                stop.set()
                if label == "during rebuilds":
                    thread.join()
                changes += changed[0]
            print(f"  round {round_index + 1}/{rounds} done", flush=True)
    finally:
        for client in clients:
            await client.__aexit__(None, None, None)
    rows = {}
    for label, samples in results.items():
        ordered = sorted(samples)
        p99 = ordered[int(len(ordered) * 0.99) - 1]
        rows[label] = p99
        print(f"  {label:<16} {len(samples):>6} requests   p50 "
              f"{fmt(statistics.median(samples))}   p99 {fmt(p99)}", flush=True)
    print(f"  registry changes during the measured rounds: {changes}")
    print(f"  p99 during rebuilds / quiet: {rows['during rebuilds'] / rows['quiet']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,20000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeats, args.requests, args.rounds = "200,1000", 2, 200, 1
    logging.getLogger("chainweaver").setLevel(logging.ERROR)
    sizes = [int(size) for size in args.sizes.split(",")]
    print("== 1. Rebuild time (best of repeats; ratio against deciding from scratch) ==",
          flush=True)
    for size in sizes:
        bench_rebuild(size, args.repeats)
    print(f"\n== 2. Requests during rebuilds, {max(sizes)} flows, {CLIENTS} clients ==",
          flush=True)
    asyncio.run(bench_requests(max(sizes), args.requests, args.rounds))


if __name__ == "__main__":
    main()
