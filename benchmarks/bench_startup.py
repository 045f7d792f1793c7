"""Server start-up cost against the catalogue size, and what ``gc.freeze()`` does to lists.

1. Start: construction plus an in-memory ``fastmcp.Client`` connecting, for a bare
   one-tool FastMCP server, FlowServer over a small catalogue and over a large one
   (both ``expose_schemas`` and ``expose_prompts``). Targets: large <= 3x small,
   large <= 10x bare. All measured in this run, taking turns, gc collected before each.
2. Where the large start goes: construction by part (the exposure decision visits
   every flow: it is the governance filter) and the connect.
3. ``tools/list``, ``prompts/list`` and ``resources/list`` latency at two catalogue
   sizes, without and with ``gc.freeze()`` after start-up (``ServingConfig(freeze_gc=
   True)``), and the time each list spends in the garbage collector. Each
   configuration runs in a fresh process (the freeze is process-wide), taking turns.

Run: ``python benchmarks/bench_startup.py [--small N] [--large N] [--repeats N]
[--list-sizes N,N] [--list-rounds N] [--list-calls N] [--quick]``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench_server import bare_classify, build_executor, fmt
from fastmcp import Client, FastMCP
from fastmcp.tools.function_tool import FunctionTool

import chainweaver
from chainweaver.mcp import ExposurePolicy, FlowServer, ServingConfig
from chainweaver.mcp.publish.contract import build_contract
from chainweaver.mcp.publish.decision import _exclusion_reason
from chainweaver.mcp.publish.exposure import Exposure

FLAGS = {"expose_schemas": True, "expose_prompts": True}
START_TARGETS = {"large vs small": 3.0, "large vs bare": 10.0}
LIST_KINDS = ("tools/list", "prompts/list", "resources/list")
# "freeze_gc=True": the setting, which freezes at the end of construction, before
# any component is built. "after first lists": a manual freeze once every component
# is built too, for comparison.
GC_VARIANTS = ("no freeze", "freeze_gc=True", "freeze after first lists")


def spread(samples: list[float]) -> str:
    return f"{fmt(min(samples))} / {fmt(statistics.median(samples))}"


def section(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


# ------------------------------------------------------------ 1. start-up


def bare_server() -> FastMCP:
    """The baseline: FastMCP with one function tool (the same work as one flow)."""
    server = FastMCP("bare")
    server.add_tool(FunctionTool.from_function(bare_classify))
    return server


async def start(build: Callable[[], FastMCP]) -> tuple[float, float]:
    """Seconds to construct, and to construct and have a client connected."""
    gc.collect()
    started = time.perf_counter()
    server = build()
    built = time.perf_counter()
    async with Client(server):
        connected = time.perf_counter()
    return built - started, connected - started


async def bench_start(small: int, large: int, repeats: int) -> dict[str, list[float]]:
    executors = {"small": build_executor(small), "large": build_executor(large)}
    builds: dict[str, Callable[[], FastMCP]] = {
        "bare": bare_server,
        "small": lambda: FlowServer(executors["small"], **FLAGS).fastmcp,
        "large": lambda: FlowServer(executors["large"], **FLAGS).fastmcp,
    }
    labels = {"bare": "bare FastMCP, 1 tool", "small": f"FlowServer, {small} flows",
              "large": f"FlowServer, {large} flows"}
    section(f"1. Start = construct + in-memory client connected; {repeats} repeats, "
            f"both flags (best / median)")
    # The first start in the process also imports, and generates the catalogue's
    # JSON Schemas once per model: shown, not counted.
    for name, build in builds.items():
        _, total = await start(build)
        print(f"  first start in process, {labels[name]:<26} {fmt(total)}", flush=True)
    construct: dict[str, list[float]] = {name: [] for name in builds}
    total: dict[str, list[float]] = {name: [] for name in builds}
    names = list(builds)
    for repeat in range(repeats):
        for name in names[repeat % 3:] + names[:repeat % 3]:
            built, connected = await start(builds[name])
            construct[name].append(built)
            total[name].append(connected)
    for name in names:
        connect = [t - c for t, c in zip(total[name], construct[name], strict=True)]
        print(f"  {labels[name]:<28} start {spread(total[name])}"
              f"   (construct {spread(construct[name])}, connect {spread(connect)})",
              flush=True)
    print("  ratios (best/best, median/median):")
    for label, (top, bottom) in {"large vs small": ("large", "small"),
                                 "large vs bare": ("large", "bare")}.items():
        best = min(total[top]) / min(total[bottom])
        median = statistics.median(total[top]) / statistics.median(total[bottom])
        target = START_TARGETS[label]
        verdict = "PASS" if best <= target else "FAIL"
        print(f"  {verdict}  start, {label:<15} {best:7.1f}x (median {median:.1f}x)  "
              f"target <= {target:g}x", flush=True)
    return total


# ----------------------------------------------------- 2. where it goes


def _best(run: Callable[[], Any], repeats: int) -> float:
    """Best of ``repeats`` runs, with the cyclic GC paused as the decision runs it."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
        finally:
            gc.enable()
    return best


def bench_parts(flows: int, repeats: int) -> None:
    section(f"2. Construction over {flows} flows by part, both flags (best; per flow)")
    executor = build_executor(flows)
    policy = ExposurePolicy()
    registry = executor.registry
    catalogue = [registry.get_flow(name) for name in registry.flow_names()]
    safety = [executor.effective_safety(flow) for flow in catalogue]
    build_contract(executor, catalogue[0])  # the one-off schema generation
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("walk the registry (names, get_flow)",
         lambda: [registry.get_flow(name) for name in registry.flow_names()]),
        ("executor.check_flow", lambda: [executor.check_flow(f) for f in catalogue]),
        ("executor.effective_safety",
         lambda: [executor.effective_safety(f) for f in catalogue]),
        ("policy filters (_exclusion_reason)",
         lambda: [_exclusion_reason(f, executor, policy, s)
                  for f, s in zip(catalogue, safety, strict=True)]),
        ("build_contract (shared per model pair)",
         lambda: [build_contract(executor, f) for f in catalogue]),
    ]
    measured = [(label, _best(run, repeats)) for label, run in parts]
    decision = _best(lambda: Exposure(executor, policy, **FLAGS).catalogue, repeats)
    server = _best(lambda: FlowServer(executor, **FLAGS), repeats)
    measured.append(("snapshot entries and the rest",
                     decision - sum(seconds for _, seconds in measured)))
    measured.append(("every flow decided (catalogue), total", decision))
    measured.append(("FlowServer(...), total", server))
    for label, seconds in measured:
        print(f"  {label:<42} {fmt(seconds)}  {seconds / flows * 1e6:6.2f} us/flow",
              flush=True)


# ------------------------------------------------- 3. lists and gc.freeze


class GcClock:
    """Time spent in the cyclic garbage collector, and its full collections.

    Read through ``gc.callbacks``: a figure that noise from other processes moves
    much less than wall-clock time, and the one ``gc.freeze()`` can change.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.full += info["generation"] == 2


def list_calls(flows: int) -> int:
    """Measured calls per kind in one worker: fewer for big lists (seconds each)."""
    return max(3, min(20, 40_000 // flows))


async def list_worker(flows: int, variant: str, calls: int) -> dict[str, Any]:
    """One fresh process: start a server, maybe freeze, then time lists of each kind."""
    executor = build_executor(flows)
    serving = ServingConfig(freeze_gc=variant == "freeze_gc=True")
    server = FlowServer(executor, serving=serving, **FLAGS)
    result: dict[str, Any] = {"first": {}, "warm": {kind: [] for kind in LIST_KINDS},
                              "gc": {kind: [] for kind in LIST_KINDS},
                              "full": {kind: [] for kind in LIST_KINDS}}
    clock = GcClock()
    gc.callbacks.append(clock)
    async with Client(server.fastmcp) as client:
        ops = {"tools/list": client.list_tools, "prompts/list": client.list_prompts,
               "resources/list": client.list_resources}
        for kind in LIST_KINDS:  # builds every component
            started = time.perf_counter()
            await ops[kind]()
            result["first"][kind] = time.perf_counter() - started
        if variant == "freeze after first lists":
            gc.collect()
            gc.freeze()
        result["frozen_objects"] = gc.get_freeze_count()
        # No collection between calls: a serving process does not get one either.
        for turn in range(calls):
            for kind in LIST_KINDS[turn % 3:] + LIST_KINDS[:turn % 3]:
                gc_seconds, full = clock.seconds, clock.full
                started = time.perf_counter()
                await ops[kind]()
                result["warm"][kind].append(time.perf_counter() - started)
                result["gc"][kind].append(clock.seconds - gc_seconds)
                result["full"][kind].append(clock.full - full)
    gc.callbacks.remove(clock)
    return result


def run_worker(flows: int, variant: str, calls: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--list-worker", str(flows),
               variant, str(calls)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"list worker failed ({flows} flows, {variant}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_lists(sizes: Iterable[int], rounds: int, calls_per_kind: int | None = None) -> None:
    for flows in sizes:
        calls = calls_per_kind or list_calls(flows)
        section(f"3. Lists at {flows} flows, both flags, without and with gc.freeze() "
                f"({rounds} rounds x {calls} calls per kind, each in a fresh process)")
        warm: dict[str, dict[str, list[float]]] = {
            v: {kind: [] for kind in LIST_KINDS} for v in GC_VARIANTS}
        first: dict[str, dict[str, list[float]]] = {
            v: {kind: [] for kind in LIST_KINDS} for v in GC_VARIANTS}
        in_gc: dict[str, dict[str, list[float]]] = {
            v: {kind: [] for kind in LIST_KINDS} for v in GC_VARIANTS}
        full: dict[str, dict[str, list[int]]] = {
            v: {kind: [] for kind in LIST_KINDS} for v in GC_VARIANTS}
        frozen: dict[str, int] = {}
        for turn in range(rounds):
            for variant in GC_VARIANTS[turn % 3:] + GC_VARIANTS[:turn % 3]:
                result = run_worker(flows, variant, calls)
                frozen[variant] = result["frozen_objects"]
                for kind in LIST_KINDS:
                    warm[variant][kind] += result["warm"][kind]
                    in_gc[variant][kind] += result["gc"][kind]
                    full[variant][kind] += result["full"][kind]
                    first[variant][kind].append(result["first"][kind])
        for variant in GC_VARIANTS:
            print(f"  {variant} ({frozen[variant]} objects frozen)", flush=True)
            for kind in LIST_KINDS:
                line = (f"    {kind:<15} {spread(warm[variant][kind])}"
                        f"   in gc {fmt(statistics.median(in_gc[variant][kind]))}"
                        f" ({statistics.median(full[variant][kind]):g} full)"
                        f"   first {fmt(min(first[variant][kind]))}")
                if variant != GC_VARIANTS[0]:
                    base = warm[GC_VARIANTS[0]][kind]
                    mine = warm[variant][kind]
                    line += (f"   no freeze / this: {min(base) / min(mine):5.2f}x "
                             f"(median {statistics.median(base) / statistics.median(mine):.2f}x)")
                print(line, flush=True)


# ------------------------------------------------------------------ main


async def first_list_worker(flows: int, page_size: int | None) -> dict[str, float]:
    """One fresh process: build the server, connect, and time the first ``tools/list``
    (every flow judged), in wall-clock and in this process's CPU time (which other
    jobs on a shared machine disturb much less)."""
    executor = build_executor(flows)
    gc.collect()
    started = time.perf_counter()
    server = FlowServer(executor, serving=ServingConfig(page_size=page_size), **FLAGS)
    built = time.perf_counter()
    async with Client(server.fastmcp) as client:
        connected, cpu = time.perf_counter(), time.process_time()
        tools = await client.list_tools_mcp()
        listed, cpu = time.perf_counter(), time.process_time() - cpu
    return {"construct": built - started, "connect": connected - built,
            "first tools/list": listed - connected, "cpu": cpu, "tools": len(tools.tools),
            "plans compiled": executor.plans_compiled}


def bench_first_list(flows: int, rounds: int, reference: str | None,
                     page_size: int | None = None) -> None:
    """Section 4: the first ``tools/list`` after start, each in a fresh process; with
    ``reference`` (a folder holding another ``chainweaver``), that code in turns."""
    section(f"4. First tools/list after start at {flows} flows, page size {page_size} "
            f"({rounds} fresh processes"
            f"{' per side, in turns' if reference else ''})")
    sides = {"this tree": None, **({"reference": reference} if reference else {})}
    samples: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for turn in range(rounds):
        order = list(sides) if turn % 2 == 0 else list(sides)[::-1]
        for side in order:
            env = dict(os.environ)
            if sides[side] is not None:
                env["PYTHONPATH"] = str(sides[side])
            command = [sys.executable, str(Path(__file__).resolve()), "--first-list-worker",
                       str(flows), str(page_size or 0)]
            done = subprocess.run(command, capture_output=True, text=True, check=False,
                                  env=env)
            if done.returncode != 0:
                raise SystemExit(f"first-list worker failed ({side}):\n{done.stderr}")
            samples[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for side, runs in samples.items():
        first = [run["first tools/list"] for run in runs]
        cpu = [run["cpu"] for run in runs]
        print(f"  {side:<10} first tools/list {spread(first)}   CPU {spread(cpu)}   construct "
              f"{fmt(min(run['construct'] for run in runs))}   listed "
              f"{runs[0]['tools']:g} tools, {runs[0]['plans compiled']:g} plans compiled",
              flush=True)
    if reference:
        mine = [run["first tools/list"] for run in samples["this tree"]]
        base = [run["first tools/list"] for run in samples["reference"]]
        cpu_mine = [run["cpu"] for run in samples["this tree"]]
        cpu_base = [run["cpu"] for run in samples["reference"]]
        print(f"  reference / this tree: {min(base) / min(mine):.1f}x best, "
              f"{statistics.median(base) / statistics.median(mine):.1f}x median; CPU "
              f"{min(cpu_base) / min(cpu_mine):.1f}x best")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--small", type=int, default=100, help="small catalogue (100)")
    parser.add_argument("--large", type=int, default=20_000, help="large catalogue (20000)")
    parser.add_argument("--repeats", type=int, default=7, help="starts per server (7)")
    parser.add_argument("--list-sizes", default="1000,20000",
                        help="catalogue sizes for the list section (1000,20000)")
    parser.add_argument("--list-rounds", type=int, default=2,
                        help="fresh processes per size and variant (2)")
    parser.add_argument("--list-calls", type=int, default=None,
                        help="measured calls per kind in each list process "
                             "(default: 20, fewer above 2,000 flows)")
    parser.add_argument("--lists-only", action="store_true",
                        help="run section 3 only")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: small sizes, few repeats")
    parser.add_argument("--first-list", type=int, default=None, metavar="FLOWS",
                        help="run section 4 only: the first tools/list at FLOWS flows")
    parser.add_argument("--first-list-rounds", type=int, default=3,
                        help="fresh processes per side for section 4 (3)")
    parser.add_argument("--first-list-ref", default=None, metavar="DIR",
                        help="a folder holding another chainweaver package to run in turns")
    parser.add_argument("--first-list-page-size", type=int, default=None,
                        help="ServingConfig(page_size=...) for section 4 (none: cut by size)")
    parser.add_argument("--first-list-worker", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--list-worker", nargs=3, metavar=("FLOWS", "VARIANT", "CALLS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.getLogger("chainweaver").setLevel(logging.ERROR)
    if args.list_worker:
        flows, variant, calls = args.list_worker
        print(json.dumps(asyncio.run(list_worker(int(flows), variant, int(calls)))))
        return
    if args.first_list_worker:
        flows, page = args.first_list_worker
        print(json.dumps(asyncio.run(first_list_worker(flows, page or None))))
        return
    if args.first_list:
        print(f"chainweaver from {Path(chainweaver.__file__).parent}", flush=True)
        bench_first_list(args.first_list, args.first_list_rounds, args.first_list_ref,
                         args.first_list_page_size)
        return
    if args.quick:
        args.small, args.large, args.repeats = 10, 400, 3
        args.list_sizes, args.list_rounds, args.list_calls = "100,400", 1, 3
    sizes = [int(size) for size in args.list_sizes.split(",") if size]

    print(f"Start-up benchmark: {args.small} and {args.large} flows, {args.repeats} "
          f"repeats; list sizes {', '.join(map(str, sizes))}", flush=True)
    started = time.perf_counter()
    if not args.lists_only:
        asyncio.run(bench_start(args.small, args.large, args.repeats))
        bench_parts(args.large, max(3, args.repeats // 2))
    bench_lists(sizes, args.list_rounds, args.list_calls)
    bench_first_list(args.large, 1 if args.quick else 3, None)
    print(f"\n(whole run {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
