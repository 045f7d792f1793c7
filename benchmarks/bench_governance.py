"""Shared governance: how fast a change reaches every replica, and what it costs one.

1. Propagation: replica processes (each a FlowServer with ``governance=`` on a private
   ``redis-server``, serving nothing else) follow one shared state; each change is made
   with ``GovernanceStore.change`` and timed from its return to the last replica's
   apply (the wall time each replica logs, same machine clock). Measured with 1, 4 and
   8 replicas running (started one group after another).
2. The cost of one change at 1,000 and 20,000 registered flows, in one process: the
   overlay applies the decision to the registry, and the server's follower swaps in
   the next snapshot (what every replica does per change), and a full re-read of the
   shared state from Redis (what a replica does per message).

Run: ``python benchmarks/bench_governance.py [--changes N] [--quick]``. Needs
``redis-server`` and the tasks extra (``redis``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench_common import free_port, machine_line, percentile

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.governance import Decision, GovernanceStore, SharedState
from chainweaver.mcp import FlowServer

APPLIED = re.compile(r"applied version (\d+) at (\S+) ")
REPLICA = r'''
import asyncio, logging, sys
sys.path.insert(0, {bench!r})
from bench_governance import executor
from chainweaver.mcp import FlowServer
from chainweaver.governance import GovernanceSettings
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
logging.getLogger("chainweaver.governance").setLevel(logging.INFO)
server = FlowServer(executor(100), governance=GovernanceSettings(
    url={url!r}, heartbeat_interval=0.5))
async def main():
    from fastmcp import Client
    async with Client(server.fastmcp):
        await asyncio.Event().wait()
asyncio.run(main())
'''


@tool(safety=ToolSafetyContract(SideEffectLevel.READ))
def echo(n: int) -> dict:
    """Echo n."""
    return {"n": n}


def executor(flows: int) -> FlowExecutor:
    built = FlowExecutor(FlowRegistry())
    built.register_tool(echo)
    for i in range(flows):
        built.registry.register_flow(Flow(f"flow_{i}", f"Flow {i}.", [FlowStep("echo")]))
    return built


def start_redis(workdir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
         "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    return process, f"redis://127.0.0.1:{port}/0"


async def heartbeats(url: str, count: int, version: int) -> None:
    store = GovernanceStore(url)
    try:
        for _ in range(600):  # bounded: a broken replica stops the benchmark
            beats = await store.heartbeats()
            if sum(b["version"] >= version and time.time() - b["seen"] < 5
                   for b in beats.values()) >= count:
                return
            await asyncio.sleep(0.05)
        raise SystemExit(f"{count} replicas did not report version {version}")
    finally:
        await store.aclose()


async def propagation(url: str, logs: list[Path], changes: int) -> list[float]:
    """Make ``changes`` changes; per change, its return to the last replica's apply."""
    store = GovernanceStore(url)
    returned: dict[int, float] = {}
    try:
        for i in range(changes):
            change = await store.change(f"flow_{i % 10}", None,
                                        "archived" if i % 20 < 10 else "active", by="bench")
            returned[change.version] = time.time()
            await asyncio.sleep(0.1)
    finally:
        await store.aclose()
    await heartbeats(url, len(logs), max(returned))
    applies = [[(int(m[1]), datetime.fromisoformat(m[2]).timestamp())
                for m in APPLIED.finditer(log.read_text())] for log in logs]
    return [max(min(at for v, at in seen if v >= version) for seen in applies) - at_return
            for version, at_return in returned.items()]


def section_propagation(changes: int) -> None:
    print("== 1. Propagation: change returned -> last replica applied ==")
    with tempfile.TemporaryDirectory(prefix="cw-bench-gov-") as workdir:
        redis, url = start_redis(workdir)
        replicas: list[subprocess.Popen] = []
        logs: list[Path] = []
        try:
            for total in (1, 4, 8):
                while len(replicas) < total:
                    log = Path(workdir) / f"replica-{len(replicas)}.log"
                    with open(log, "w") as output:
                        replicas.append(subprocess.Popen(
                            [sys.executable, "-c", REPLICA.format(
                                bench=str(Path(__file__).parent), url=url)],
                            stdout=subprocess.DEVNULL, stderr=output))
                    logs.append(log)
                asyncio.run(heartbeats(url, total, 0))
                times = asyncio.run(propagation(url, logs, changes))
                print(f"{total} replica(s), {changes} changes: p50 "
                      f"{statistics.median(times) * 1000:.1f} ms, p99 "
                      f"{percentile(times, 0.99) * 1000:.1f} ms, max "
                      f"{max(times) * 1000:.1f} ms")
        finally:
            for process in replicas:
                process.kill()
                process.wait()
            redis.kill()
            redis.wait()


def section_cost(url: str, sizes: tuple[int, ...], repeats: int) -> None:
    print("== 2. Cost of one change, per replica ==")
    for size in sizes:
        built = executor(size)
        server = FlowServer(built, governance=url)
        overlay = server._shared.follower.overlay  # type: ignore[union-attr]
        server.exposure_report()  # the catalogue decided once, as a serving replica has it
        times = []
        for i in range(repeats):
            action = "archived" if i % 2 == 0 else "active"
            state = SharedState(i + 1, {"flow_7": Decision(all=action)})
            started = time.perf_counter()
            overlay.apply(state)
            times.append(time.perf_counter() - started)
        print(f"{size} flows: apply + snapshot swap: best {min(times) * 1e6:.0f} us, "
              f"median {statistics.median(times) * 1e6:.0f} us")

    async def reads() -> list[float]:
        store = GovernanceStore(url)
        try:
            for i in range(50):  # 50 flows with a decision each
                await store.change(f"flow_{i}", None, "deprecated", by="bench")
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                await store.read()
                times.append(time.perf_counter() - started)
            return times
        finally:
            await store.aclose()

    times = asyncio.run(reads())
    print(f"re-read of the shared state (50 decisions) from Redis: best "
          f"{min(times) * 1e6:.0f} us, median {statistics.median(times) * 1e6:.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="20 changes, 1,000 flows only")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    print(machine_line())
    section_propagation(20 if args.quick else args.changes)
    with tempfile.TemporaryDirectory(prefix="cw-bench-gov-") as workdir:
        redis, url = start_redis(workdir)
        try:
            section_cost(url, (1_000,) if args.quick else (1_000, 20_000),
                         10 if args.quick else 30)
        finally:
            redis.kill()
            redis.wait()


if __name__ == "__main__":
    main()
