"""What run records cost: a 3-step flow's ``tools/call`` on a server with a run history
(in memory) against the same server without one, in the same run; and reading a page of
50 runs out of 100,000 stored, in memory and on a local Redis.

Calls go through an in-memory ``fastmcp.Client`` (2026-07-28) with run notifications
off (``ServingConfig(run_notifications=False)``), so the call path itself is measured.
With and without take turns in short chunks (which goes first alternates), so noise hits
both; each chunk's wall time and this process's CPU time (client and server both run
here, so CPU time is the call's whole cost, and other processes on a shared machine
barely move it) are reported. **Targets:** with <= 1.05x without (median of the chunk
pairs' ratios); page p95 < 20 ms.

Run: ``python benchmarks/bench_run_records.py [--repeats N] [--number N] [--redis URL]``
(without ``--redis`` a private ``redis-server`` is started when one is installed).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from fastmcp import Client
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer, RunHistory, ServingConfig
from chainweaver.mcp.runs.records import MemoryRunStore, RunQuery, RunRecord, RunStore

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from bench_common import free_port, machine_line, percentile  # noqa: E402

READ = ToolSafetyContract("read")
STORED = 100_000


class N(BaseModel):
    n: int


@tool(safety=READ)
def one(value: N) -> N:
    return N(n=value.n + 1)


@tool(safety=READ)
def two(value: N) -> N:
    return N(n=value.n * 2)


@tool(safety=READ)
def three(value: N) -> N:
    return N(n=value.n - 3)


def server(history: RunHistory | None) -> FlowServer:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for each in (one, two, three):
        executor.register_tool(each)
    registry.register_flow(Flow("triple", "Three steps.", [FlowStep("one"), FlowStep("two"),
                                                           FlowStep("three")]))
    return FlowServer(executor, serving=ServingConfig(run_notifications=False),
                      run_history=history)


async def calls(repeats: int, number: int) -> None:
    plain, recorded = server(None), server(RunHistory())
    async with Client(plain.fastmcp) as off, Client(recorded.fastmcp) as on:
        async def chunk(client: Client) -> tuple[float, float]:
            """Wall and CPU time of one call (this process runs client and server)."""
            wall, cpu = time.perf_counter(), time.process_time()
            for index in range(number):
                await client.session.call_tool("triple", {"n": index})
            return ((time.perf_counter() - wall) / number,
                    (time.process_time() - cpu) / number)

        for _ in range(3):  # warm up
            await chunk(off), await chunk(on)
        measured: dict[Client, list[tuple[float, float]]] = {off: [], on: []}
        for turn in range(repeats):
            for client in ((off, on) if turn % 2 else (on, off)):
                measured[client].append(await chunk(client))
    for kind, index in (("wall", 0), ("CPU", 1)):
        offs = [times[index] for times in measured[off]]
        ons = [times[index] for times in measured[on]]
        ratios = [t_on / t_off for t_on, t_off in zip(ons, offs, strict=True)]
        print(f"3-step call ({kind}), without records: best {min(offs) * 1e6:.0f} us, "
              f"median {statistics.median(offs) * 1e6:.0f} us")
        print(f"3-step call ({kind}), with records:    best {min(ons) * 1e6:.0f} us, "
              f"median {statistics.median(ons) * 1e6:.0f} us")
        print(f"with/without ({kind}): best/best {min(ons) / min(offs):.3f}x, median/median "
              f"{statistics.median(ons) / statistics.median(offs):.3f}x, median of "
              f"{len(ratios)} pair ratios {statistics.median(ratios):.3f}x (target <= 1.05x)")


async def fill(store: RunStore, count: int) -> None:
    now = time.time()
    for index in range(count):
        await store.save(RunRecord(f"{index:024x}", f"flow{index % 20}", "1.0.0",
                                   f"flow{index % 20}", "caller", int(now * 1e6) + index,
                                   now, status="completed"), new=True)


async def pages(store: RunStore, label: str, reads: int) -> None:
    times = []
    first, cursor = await store.page(RunQuery(caller="caller", limit=50))
    cursors = [None, cursor]
    for _ in range(reads):
        started = time.perf_counter()
        found, following = await store.page(RunQuery(caller="caller", limit=50,
                                                     cursor=random.choice(cursors)))
        times.append(time.perf_counter() - started)
        assert len(found) == 50
        if following is not None and len(cursors) < 200:
            cursors.append(following)
    print(f"page of 50 of {STORED:,} ({label}): p50 {percentile(times, 0.5) * 1e3:.2f} ms, "
          f"p95 {percentile(times, 0.95) * 1e3:.2f} ms (target < 20 ms)")


async def redis_pages(url: str, reads: int) -> None:
    from chainweaver.mcp.runs.redis_records import RedisRunStore

    store = RedisRunStore(url, max_runs=STORED + 1, prefix=f"bench:{time.time_ns()}")
    try:
        await fill(store, STORED)
        await pages(store, "Redis", reads)
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="chunk pairs")
    parser.add_argument("--number", type=int, default=20, help="calls a chunk")
    parser.add_argument("--reads", type=int, default=500)
    parser.add_argument("--redis", help="a Redis URL (default: start redis-server)")
    args = parser.parse_args()
    print(machine_line())
    asyncio.run(calls(args.repeats, args.number))
    memory = MemoryRunStore(max_runs=STORED + 1)
    asyncio.run(fill(memory, STORED))
    asyncio.run(pages(memory, "memory", args.reads))
    if args.redis:
        asyncio.run(redis_pages(args.redis, args.reads))
        return
    binary = shutil.which("redis-server")
    if binary is None:
        print("page of 50 (Redis): skipped, no redis-server installed")
        return
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                                    "--save", "", "--appendonly", "no", "--dir", workdir],
                                   stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            asyncio.run(redis_pages(f"redis://127.0.0.1:{port}/0", args.reads))
        finally:
            process.terminate()
            process.wait()


if __name__ == "__main__":
    main()
