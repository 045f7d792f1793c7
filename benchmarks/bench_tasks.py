"""Background tasks: what a task handle costs, and task throughput in memory and on Redis.

Sections, each against a baseline measured in the same run:

1. Time from ``tools/call`` (asking for a task) to the task handle, against a plain
   ``tools/call`` of the same 3-step flow (in memory, 2026-07-28 client; the tasked
   server only enqueues, so earlier tasks do not run meanwhile).
2. 1,000 short tasks in memory (``FlowServer(tasks="memory://")``, the server runs
   them), against 1,000 plain calls of the same flow, both 50 at a time; rounds of
   each taken in turns, medians compared.
3. 1,000 short tasks on Redis: an enqueue-only replica (in this process) queues them
   all while the workers wait, then 1, or 2, warm ``chainweaver worker`` processes run
   them and only that is timed; rounds of 1 and 2 workers taken in turns, medians
   compared: how throughput scales with workers. The replica's creation rate is
   printed too. Needs ``redis-server`` (a private one on a random loopback port).
4. Durable runs: the same short tasks on Redis (one warm worker), with step checkpoints
   (what every task run does) against the same worker told to run without them
   (``BENCH_NO_CHECKPOINTS=1``), in turns; per task, the ratio says what checkpoints cost.
5. Start-up with tasks: ``FlowServer(tasks="memory://")`` built and a client connected
   (Docket started), over a large catalogue against 100 flows, and against the same
   catalogue without tasks: tasks must add nothing that grows with the catalogue.

Each task's last step counts itself (in Redis for section 3), so completion is seen
when it happens, not when a client happens to poll. This file is also the ``--tools``
module the workers load.

Run: ``python benchmarks/bench_tasks.py [--tasks N] [--calls N] [--rounds N] [--quick]
[--no-redis]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_common import free_port, ignore_log
from pydantic import BaseModel

from chainweaver import SideEffectLevel, ToolSafetyContract, tool

READ = ToolSafetyContract(SideEffectLevel.READ)
# Tasks a `chainweaver worker` runs at once (--task-concurrency; BENCH_SLOTS to vary it).
WORKER_SLOTS = int(os.environ.get("BENCH_SLOTS", 10))
STEP_SLEEP = 0.02  # seconds of (simulated) I/O in the last step of a task
FLOW = """name: bench_task
description: Three short steps; the last one waits a little, like a call to a service.
steps:
  - bench_first
  - bench_second
  - bench_last
"""
DONE: dict[str, Any] = {"count": 0, "redis": None}


class Number(BaseModel):
    n: int


def _redis() -> Any:
    if DONE["redis"] is None:
        import redis.asyncio as redis

        DONE["redis"] = redis.Redis.from_url(os.environ["BENCH_REDIS"])
    return DONE["redis"]


@tool(safety=READ)
async def bench_first(n: int) -> Number:
    """First step. On Redis, waits until the benchmark says go (``bench:go``), so every
    task is queued before the workers start on them."""
    if os.environ.get("BENCH_REDIS"):
        await _redis().incr("bench:started")
        while await _redis().get("bench:go") != b"1":
            await asyncio.sleep(0.01)
    return Number(n=n + 1)


@tool(safety=READ)
async def bench_second(n: int) -> Number:
    """Second step."""
    return Number(n=n * 2)


@tool(safety=READ)
async def bench_last(n: int) -> Number:
    """Last step: waits STEP_SLEEP (BENCH_SLEEP), then counts itself."""
    await asyncio.sleep(float(os.environ.get("BENCH_SLEEP", STEP_SLEEP)))
    if os.environ.get("BENCH_REDIS"):
        await _redis().incr("bench:done")
    else:
        DONE["count"] += 1
    return Number(n=n)


# ------------------------------------------------------------------------ set-up


def _without_checkpoints() -> None:
    """The baseline of section 4: this worker runs task flows without checkpoints."""
    from chainweaver.mcp.tasks import runner

    runner.checkpoint_store = lambda docket: None  # type: ignore[assignment,return-value]


if os.environ.get("BENCH_NO_CHECKPOINTS"):
    _without_checkpoints()


def flow_dir() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="cw-bench-tasks-"))
    (directory / "bench_task.flow.yaml").write_text(FLOW)
    return directory


def build_server(flows: Path, tasks: Any, **options: Any) -> Any:
    from chainweaver import FlowExecutor, FlowRegistry
    from chainweaver.files import find_flow_files, load_flows
    from chainweaver.mcp import FlowServer

    executor = FlowExecutor(FlowRegistry())
    for step in (bench_first, bench_second, bench_last):
        executor.register_tool(step)
    for flow in load_flows(find_flow_files([flows]), tools=executor.tools):
        executor.registry.register_flow(flow)
    return FlowServer(executor, tasks=tasks, **options)


async def timed(calls: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    times = []
    for i in range(calls):
        started = time.perf_counter()
        await call(i)
        times.append(time.perf_counter() - started)
    return times


def row(label: str, times: list[float]) -> str:
    return (f"  {label:<44} best {min(times) * 1e3:8.3f} ms   "
            f"median {statistics.median(times) * 1e3:8.3f} ms")


async def bounded(total: int, width: int, call: Callable[[int], Awaitable[Any]]) -> None:
    gate = asyncio.Semaphore(width)

    async def one(i: int) -> None:
        async with gate:
            await call(i)

    await asyncio.gather(*(one(i) for i in range(total)))


async def until(done: Callable[[], Awaitable[int]], total: int, limit: float) -> float:
    """Seconds until ``done()`` reaches ``total`` (polled every 5 ms), bounded."""
    started = time.perf_counter()
    while await done() < total:
        if time.perf_counter() - started > limit:
            raise SystemExit(f"only {await done()} of {total} tasks finished in {limit} s")
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


# --------------------------------------------------------------------- sections


async def handle_latency(flows: Path, calls: int) -> float:
    from fastmcp import Client
    from fastmcp_tasks import call_tool_task

    from chainweaver.mcp import TaskSettings

    print("== 1. tools/call as a task: time to the handle, vs a plain tools/call ==")
    plain = build_server(flows, TaskSettings(mode="forbidden"))
    # Enqueue only: the handle's cost alone, not runs of earlier tasks in this process.
    tasked = build_server(flows, TaskSettings(mode="optional", concurrency=0))
    async with Client(plain.fastmcp, log_handler=ignore_log) as p, \
            Client(tasked.fastmcp, log_handler=ignore_log) as t:
        await p.call_tool("bench_task", {"n": 1})
        await call_tool_task(t, "bench_task", {"n": 1})
        os.environ["BENCH_SLEEP"] = "0"  # the plain call: no simulated wait
        try:
            base: list[float] = []
            cand: list[float] = []
            for _ in range(10):  # take turns, so noise hits both
                base += await timed(calls // 10, lambda i: p.call_tool("bench_task", {"n": i}))
                cand += await timed(calls // 10,
                                    lambda i: call_tool_task(t, "bench_task", {"n": i}))
        finally:
            os.environ.pop("BENCH_SLEEP")
    print(row("plain tools/call (flow runs inline)", base))
    print(row("tools/call -> task handle", cand))
    ratio = statistics.median(cand) / statistics.median(base)
    print(f"  handle / plain call (median): {ratio:.2f}x")
    return ratio


async def memory_throughput(flows: Path, total: int, rounds: int) -> float:
    from fastmcp import Client
    from fastmcp_tasks import call_tool_task

    from chainweaver.mcp import TaskSettings

    print(f"== 2. {total} short tasks in memory (50 at a time), vs {total} plain calls, "
          f"{rounds} round(s) in turns ==")
    plain = build_server(flows, TaskSettings(mode="forbidden"))
    tasked = build_server(flows, TaskSettings(mode="optional"))
    rates: dict[str, list[float]] = {"plain": [], "tasks": []}
    async with Client(plain.fastmcp, log_handler=ignore_log) as p, \
            Client(tasked.fastmcp, log_handler=ignore_log) as t:

        async def done() -> int:
            return int(DONE["count"])

        for round_ in range(rounds):  # in turns (which goes first alternates)
            for side in ("plain", "tasks") if round_ % 2 == 0 else ("tasks", "plain"):
                DONE["count"] = 0
                started = time.perf_counter()
                if side == "plain":
                    await bounded(total, 50, lambda i: p.call_tool("bench_task", {"n": i}))
                else:
                    await bounded(total, 50,
                                  lambda i: call_tool_task(t, "bench_task", {"n": i}))
                    enqueued = time.perf_counter() - started
                    await until(done, total, 300)
                rates[side].append(total / (time.perf_counter() - started))
                if side == "tasks":
                    print(f"  round {round_ + 1}: tasks {rates['tasks'][-1]:7.1f} tasks/s "
                          f"(created at {total / enqueued:.1f} tasks/s)")
                else:
                    print(f"  round {round_ + 1}: plain {rates['plain'][-1]:7.1f} calls/s")
    base, cand = statistics.median(rates["plain"]), statistics.median(rates["tasks"])
    print(f"  plain calls: median {base:8.1f} calls/s")
    print(f"  tasks:       median {cand:8.1f} tasks/s")
    print(f"  task throughput / plain call throughput (medians): {cand / base:.2f}")
    return cand / base


@contextmanager
def local_redis(binary: str) -> Iterator[str]:
    """A private, non-persistent redis-server on a free loopback port: its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(30)


async def redis_throughput(flows: Path, total: int, rounds: int) -> float | None:
    binary = shutil.which("redis-server")
    if binary is None:
        print("== 3. skipped: redis-server is not installed ==")
        return None
    print(f"== 3. {total} short tasks on Redis, queued first, then run by 1 or 2 workers, "
          f"{rounds} round(s) in turns ==")
    rates: dict[int, list[float]] = {1: [], 2: []}
    with local_redis(binary) as url:
        for round_ in range(rounds):  # in turns (which goes first alternates)
            for workers in (1, 2) if round_ % 2 == 0 else (2, 1):
                rates[workers].append(await _workers_run(flows, url, workers, total))
    for workers in (1, 2):
        print(f"  {workers} worker(s): median {statistics.median(rates[workers]):8.1f} tasks/s")
    ratio = statistics.median(rates[2]) / statistics.median(rates[1])
    print(f"  2 workers / 1 worker (medians): {ratio:.2f}x")
    return ratio


async def durable_cost(flows: Path, total: int, rounds: int) -> float | None:
    binary = shutil.which("redis-server")
    if binary is None:
        print("== 4. skipped: redis-server is not installed ==")
        return None
    print(f"== 4. {total} short tasks on Redis, 1 worker: with checkpoints vs without ==")
    times: dict[bool, list[float]] = {True: [], False: []}
    with local_redis(binary) as url:
        for _ in range(rounds):  # in turns, so noise hits both
            for durable in (False, True):
                rate = await _workers_run(flows, url, 1, total, durable=durable, quiet=True)
                times[durable].append(1 / rate)
    for durable in (False, True):
        label = "with checkpoints" if durable else "without checkpoints"
        print(f"  {label:<22} per task: best {min(times[durable]) * 1e3:7.2f} ms   "
              f"median {statistics.median(times[durable]) * 1e3:7.2f} ms")
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    print(f"  checkpoints / none (per task, median): {ratio:.2f}x")
    return ratio


async def _workers_run(flows: Path, url: str, workers: int, total: int, *,
                       durable: bool = True, quiet: bool = False) -> float:
    import redis.asyncio as redis
    from fastmcp import Client
    from fastmcp_tasks import call_tool_task

    from chainweaver.mcp import TaskSettings

    store = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            await store.flushdb()
            break
        except (OSError, redis.ConnectionError):  # the server is still starting
            await asyncio.sleep(0.05)
    env = {**os.environ, "BENCH_REDIS": url}
    if not durable:
        env["BENCH_NO_CHECKPOINTS"] = "1"
    profile = os.environ.get("BENCH_PROFILE_WORKER")  # a file: cProfile the first worker
    command = [sys.executable, "-m", "chainweaver", "worker", str(flows), "--tools",
               __file__, "--tasks", url, "--task-concurrency", str(WORKER_SLOTS)]
    started_workers = [subprocess.Popen(
        [sys.executable, "-m", "cProfile", "-o", profile, *command[1:]]
        if profile and index == 0 else command,
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for index in range(workers)]
    replica = build_server(flows, TaskSettings(url=url, concurrency=0))

    async def done() -> int:
        return int(await store.get("bench:done") or 0)

    try:
        async with Client(replica.fastmcp, log_handler=ignore_log) as client:
            # Warm up: every worker has started and holds WORKER_SLOTS tasks at once
            # (counted as their first steps start), then they all run.
            await store.set("bench:go", 0)
            warm = workers * WORKER_SLOTS
            await bounded(warm, 20, lambda i: call_tool_task(client, "bench_task", {"n": i}))

            async def started_steps() -> int:
                return int(await store.get("bench:started") or 0)

            await until(started_steps, warm, 120)
            await store.set("bench:go", 1)
            await until(done, warm, 120)
            # Queue every task first (their first step waits for "go"), then time the
            # workers alone: the replica's creation rate is reported on its own.
            await store.set("bench:go", 0)
            await store.set("bench:done", 0)
            started = time.perf_counter()
            await bounded(total, 50, lambda i: call_tool_task(client, "bench_task", {"n": i}))
            enqueued = time.perf_counter() - started
            cpu = _cpu_seconds(started_workers)
            started = time.perf_counter()
            await store.set("bench:go", 1)
            await until(done, total, 300)
            elapsed = time.perf_counter() - started
            cpu = _cpu_seconds(started_workers) - cpu
    finally:
        for index, process in enumerate(started_workers):
            # Ctrl-C lets a profiled worker write its profile; the others are terminated:
            # a process started from a background shell job inherits SIGINT ignored, and
            # a worker that never hears Ctrl-C would be waited on, then killed.
            process.send_signal(signal.SIGINT if profile and index == 0 else signal.SIGTERM)
        for process in started_workers:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)
        await store.aclose()
    if not quiet:
        print(f"  {workers} worker(s): {total / elapsed:8.1f} tasks/s ({elapsed:.2f} s; the "
              f"replica created them at {total / enqueued:.1f} tasks/s; worker CPU "
              f"{cpu / total * 1e3:.2f} ms per task)")
    return total / elapsed


def _cpu_seconds(processes: list[subprocess.Popen[bytes]]) -> float:
    """CPU seconds (user + system) the processes used so far (Linux; else 0)."""
    total = 0.0
    for process in processes:
        try:
            fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def startup(large: int) -> tuple[float, float]:
    """Best start (build + connect) of each catalogue size, with and without tasks, taken
    in turns; returns (large / 100 flows with tasks, with / without tasks at large)."""
    from fastmcp import Client

    from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep
    from chainweaver.mcp import FlowServer

    print(f"== 5. Start with tasks: build + connect, {large} flows vs 100 flows ==")
    executors = {}
    for flows in (100, large):
        executor = FlowExecutor(FlowRegistry())
        executor.register_tool(bench_first)
        for index in range(flows):
            executor.registry.register_flow(Flow(f"f{index:05d}", "d", [FlowStep("bench_first")]))
        executors[flows] = executor
    cases = [(flows, tasks) for flows in (100, large) for tasks in (None, "memory://")]
    times: dict[tuple[int, str | None], list[float]] = {case: [] for case in cases}
    for _ in range(9):  # in turns, so noise (and the collector) hits every case
        for flows, tasks in cases:
            started = time.perf_counter()
            async with Client(FlowServer(executors[flows], tasks=tasks).fastmcp):
                pass
            times[flows, tasks].append(time.perf_counter() - started)
    for flows, tasks in cases:
        label = f"{flows} flows, {'tasks' if tasks else 'no tasks'}"
        print(row(label, times[flows, tasks]))
    best = {case: min(values) for case, values in times.items()}
    growth = best[large, "memory://"] / best[100, "memory://"]
    added = best[large, "memory://"] / best[large, None]
    print(f"  with tasks, {large} flows / 100 flows (best): {growth:.2f}x")
    print(f"  {large} flows, with tasks / without (best): {added:.2f}x")
    extra = {flows: (best[flows, "memory://"] - best[flows, None]) * 1000
             for flows in (100, large)}
    print(f"  what tasks add to start (best): {extra[100]:.2f} ms at 100 flows, "
          f"{extra[large]:.2f} ms at {large}")
    return growth, added


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000, help="tasks per throughput run")
    parser.add_argument("--calls", type=int, default=500, help="calls for section 1")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of each side in sections 2-4, taken in turns")
    parser.add_argument("--quick", action="store_true", help="small numbers (a smoke run)")
    parser.add_argument("--no-redis", action="store_true", help="skip sections 3 and 4")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.calls = 100, 50
    flows = flow_dir()
    # Rounds of each side, taken in turns (a worker process started for each Redis
    # run); one in a smoke run.
    rounds = 1 if args.quick else args.rounds
    handle = await handle_latency(flows, args.calls)
    memory = await memory_throughput(flows, args.tasks, rounds)
    scale = None if args.no_redis else await redis_throughput(flows, args.tasks, rounds)
    durable = None if args.no_redis else await durable_cost(flows, args.tasks, rounds)
    growth, added = await startup(2000 if args.quick else 20000)
    print("== Summary ==")
    print(f"  task handle / plain call: {handle:.2f}x")
    print(f"  in-memory tasks vs plain calls (throughput): {memory:.2f}")
    if scale is not None:
        print(f"  Redis, 2 workers / 1 worker (throughput): {scale:.2f}x")
    if durable is not None:
        print(f"  Redis, checkpoints / none (per task): {durable:.2f}x")
    print(f"  start with tasks, large catalogue / 100 flows: {growth:.2f}x")
    print(f"  start, large catalogue, with tasks / without: {added:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
