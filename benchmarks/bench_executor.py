"""Executor overhead, measured side by side with its baselines in one run.

1. A linear 3-step flow of trivial pydantic tools vs. hand-written validation of the same
   steps (for each tool: ``model_validate`` its input, call it, ``model_validate`` its
   output). Candidate and baseline take turns in chunks, so noise hits both.
2. The same flow on the upstream reference package (``chainweaver==0.14.1``), installed in
   its own virtual environment (``.bench-venv/upstream``) and run in a subprocess, which
   also measures the hand-written baseline under its own pydantic.
3. Fan-out: four independent async steps that each await 100 ms, then a join, through
   ``execute_flow_async``, vs. the longest branch (100 ms) and the sequential lane.
4. A 100-step DAG: per-step executor time vs. hand-written validation per step; the plan
   is compiled once for all runs.

Run: ``python benchmarks/bench_executor.py [--repeats N] [--number N] [--no-upstream]
[--profile]``. Exits non-zero only when a consistency check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, Tool

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_VENV = ROOT / ".bench-venv" / "upstream"
UPSTREAM_REQUIREMENT = "chainweaver==0.14.1"


class Text(BaseModel):
    text: str


class Cleaned(BaseModel):
    cleaned: str


class Counted(BaseModel):
    cleaned: str
    words: int


class Labelled(BaseModel):
    label: str


def clean(model: Text) -> dict:
    return {"cleaned": model.text.strip().lower()}


def count(model: Cleaned) -> dict:
    return {"cleaned": model.cleaned, "words": len(model.cleaned.split())}


def label(model: Counted) -> dict:
    return {"label": "short" if model.words < 5 else "long"}


TOOLS = [
    Tool("clean", "Normalise text.", Text, Cleaned, clean),
    Tool("count", "Count words.", Cleaned, Counted, count),
    Tool("label", "Label by length.", Counted, Labelled, label),
]
FLOW_INPUT = {"text": "  The quick brown fox  "}


def build_executor() -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for t in TOOLS:
        executor.register_tool(t)
    registry.register_flow(Flow(
        "classify", "Clean, count and label a text.",
        [FlowStep("clean"), FlowStep("count"), FlowStep("label")],
    ))
    return executor


def hand_written(data: dict) -> dict:
    """The same three tools, validated by hand with pydantic."""
    context = dict(data)
    for t in TOOLS:
        model = t.input_schema.model_validate(context)
        output = t.output_schema.model_validate(t.fn(model)).model_dump()
        context.update(output)
    return output


def side_by_side(runs: dict[str, Callable[[], object]], number: int,
                 repeats: int) -> dict[str, tuple[float, float]]:
    """Microseconds per call, (best, median) over ``repeats``; the candidates take turns
    in chunks of ``number // 10`` calls, so a noisy moment hits all of them alike."""
    chunk = max(number // 10, 1)
    for run in runs.values():  # warm up (caches, plans)
        for _ in range(max(chunk, 50)):
            run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        spent = dict.fromkeys(runs, 0.0)
        for _ in range(max(number // chunk, 1)):
            for name, run in runs.items():
                started = time.perf_counter()
                for _ in range(chunk):
                    run()
                spent[name] += time.perf_counter() - started
        for name in runs:
            samples[name].append(spent[name] / (chunk * max(number // chunk, 1)) * 1e6)
    return {name: (min(s), statistics.median(s)) for name, s in samples.items()}


def async_batches(executor: FlowExecutor, number: int, repeats: int) -> tuple[float, float]:
    """Best and median microseconds for ``await execute_flow_async`` in one event loop."""

    async def main() -> tuple[float, float]:
        for _ in range(max(number // 10, 50)):
            await executor.execute_flow_async("classify", FLOW_INPUT)
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(number):
                await executor.execute_flow_async("classify", FLOW_INPUT)
            samples.append((time.perf_counter() - started) / number * 1e6)
        return min(samples), statistics.median(samples)

    return asyncio.run(main())


def thread_hop(executor: FlowExecutor, number: int, repeats: int) -> float:
    """Best microseconds for one empty hop to the executor's worker threads."""

    async def main() -> float:
        threads = executor._lanes.threads
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(number):
                await threads.run(int)
            samples.append((time.perf_counter() - started) / number * 1e6)
        return min(samples)

    return asyncio.run(main())


def verdict(ratio: float, target: float) -> str:
    return f"(target <= {target:g}x: {'ok' if ratio <= target else 'OVER'})"


# ------------------------------------------------------------------ 1. linear


def linear(args: argparse.Namespace) -> tuple[float, float]:
    executor = build_executor()
    result = executor.execute_flow("classify", FLOW_INPUT)
    if not (result.success and result.final_output == hand_written(FLOW_INPUT)):
        sys.exit(f"consistency check failed: {result}")
    timings = side_by_side({
        "hand": lambda: hand_written(FLOW_INPUT),
        "flow": lambda: executor.execute_flow("classify", FLOW_INPUT),
    }, args.number, args.repeats)
    (hand_best, hand_median), (flow_best, flow_median) = timings["hand"], timings["flow"]
    async_number = max(args.number // 5, 1)
    async_best, async_median = async_batches(executor, async_number, args.repeats)
    hop = thread_hop(executor, async_number, args.repeats)

    print(f"3-step flow, {args.repeats} repeats; microseconds per call (best / median)")
    print(f"  hand-written pydantic   {hand_best:8.2f} / {hand_median:8.2f} us")
    print(f"  execute_flow            {flow_best:8.2f} / {flow_median:8.2f} us")
    print(f"  execute_flow_async      {async_best:8.2f} / {async_median:8.2f} us")
    ratio = flow_best / hand_best
    print(f"  ratio execute_flow / hand-written        {ratio:5.2f}x "
          f"(median {flow_median / hand_median:.2f}x) {verdict(ratio, 1.5)}")
    print(f"  ratio execute_flow_async / hand-written  {async_best / hand_best:5.2f}x "
          "(includes one worker-thread hop per run)")
    print(f"  of which an empty worker-thread hop costs {hop:8.2f} us "
          f"(async minus hop: {async_best - hop:.2f} us)")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.number):
            executor.execute_flow("classify", FLOW_INPUT)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return flow_best, hand_best


# ------------------------------------------------------------------ 2. upstream

UPSTREAM_SCRIPT = textwrap.dedent('''
    import json, statistics, sys, time
    from pydantic import BaseModel
    from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, Tool

    class Text(BaseModel):
        text: str
    class Cleaned(BaseModel):
        cleaned: str
    class Counted(BaseModel):
        cleaned: str
        words: int
    class Labelled(BaseModel):
        label: str

    def clean(m): return {"cleaned": m.text.strip().lower()}
    def count(m): return {"cleaned": m.cleaned, "words": len(m.cleaned.split())}
    def label(m): return {"label": "short" if m.words < 5 else "long"}

    TOOLS = [("clean", Text, Cleaned, clean), ("count", Cleaned, Counted, count),
             ("label", Counted, Labelled, label)]
    registry = FlowRegistry()
    executor = FlowExecutor(registry=registry)
    for name, i, o, fn in TOOLS:
        executor.register_tool(Tool(name=name, description=name, input_schema=i,
                                    output_schema=o, fn=fn))
    registry.register_flow(Flow(name="classify", description="Clean, count and label.", steps=[
        FlowStep(tool_name="clean", input_mapping={"text": "text"}),
        FlowStep(tool_name="count", input_mapping={"cleaned": "cleaned"}),
        FlowStep(tool_name="label", input_mapping={"cleaned": "cleaned", "words": "words"})]))
    DATA = {"text": "  The quick brown fox  "}

    def hand():
        context = dict(DATA)
        for _, i, o, fn in TOOLS:
            context.update(o.model_validate(fn(i.model_validate(context))).model_dump())
        return context

    def flow():
        return executor.execute_flow("classify", DATA)

    result = flow()
    assert result.success and result.final_output["label"] == "short", result
    number, repeats = int(sys.argv[1]), int(sys.argv[2])
    chunk = max(number // 10, 1)
    samples = {"hand": [], "flow": []}
    for run in (hand, flow):
        for _ in range(chunk):
            run()
    for _ in range(repeats):
        spent = {"hand": 0.0, "flow": 0.0}
        for _ in range(max(number // chunk, 1)):
            for name, run in (("hand", hand), ("flow", flow)):
                started = time.perf_counter()
                for _ in range(chunk):
                    run()
                spent[name] += time.perf_counter() - started
        for name in spent:
            samples[name].append(spent[name] / (chunk * max(number // chunk, 1)) * 1e6)
    import pydantic
    print(json.dumps({"hand": min(samples["hand"]), "flow": min(samples["flow"]),
                      "pydantic": pydantic.VERSION}))
''')


def upstream_python() -> Path | None:
    """The upstream package's interpreter, creating its venv on first use."""
    bin_dir = "Scripts" if os.name == "nt" else "bin"
    python = UPSTREAM_VENV / bin_dir / "python"
    if python.exists():
        return python
    print(f"  creating {UPSTREAM_VENV.relative_to(ROOT)} with {UPSTREAM_REQUIREMENT} ...",
          flush=True)
    steps = [[sys.executable, "-m", "venv", str(UPSTREAM_VENV)],
             [str(python), "-m", "pip", "install", "-q", UPSTREAM_REQUIREMENT]]
    for command in steps:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"  skipped: {' '.join(command[:4])} failed: "
                  f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
            return None
    return python


def upstream(args: argparse.Namespace, ours: tuple[float, float]) -> None:
    print(f"\nUpstream reference ({UPSTREAM_REQUIREMENT}), the same 3-step flow")
    python = upstream_python()
    if python is None:
        return
    number = max(args.number // 10, 20)  # the reference is much slower per call
    done = subprocess.run([str(python), "-c", UPSTREAM_SCRIPT, str(number), str(args.repeats)],
                          capture_output=True, text=True, cwd=UPSTREAM_VENV)
    if done.returncode != 0:
        sys.exit(f"upstream run failed: {done.stderr.strip()}")
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    flow_best, hand_best = ours
    print(f"  upstream execute_flow   {theirs['flow']:8.2f} us "
          f"(its hand-written baseline {theirs['hand']:.2f} us, pydantic {theirs['pydantic']})")
    print(f"  ours execute_flow       {flow_best:8.2f} us "
          f"(hand-written baseline {hand_best:.2f} us)")
    ratio = flow_best / theirs["flow"]
    print(f"  ratio ours / upstream                    {ratio:5.2f}x {verdict(ratio, 0.3)}")
    normalised = (flow_best / hand_best) / (theirs["flow"] / theirs["hand"])
    print(f"  ratio of overheads (each / its own hand-written) {normalised:5.2f}x")


# ------------------------------------------------------------------ 3. fan-out


class Wait(BaseModel):
    x: int


def fan_out_executor(delay: float) -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    names = [f"branch_{i}" for i in range(4)]
    for name in names:
        async def wait(model: Wait, _name: str = name) -> dict:
            await asyncio.sleep(delay)
            return {_name: model.x}
        executor.register_tool(Tool(name, "Wait.", Wait, None, wait))
    join_input = type("JoinInput", (BaseModel,), {"__annotations__": dict.fromkeys(names, int)})

    def join(model: BaseModel) -> dict:
        return {"total": sum(getattr(model, n) for n in names)}

    executor.register_tool(Tool("join", "Join.", join_input, None, join))
    registry.register_flow(Flow("fan_out", "Four branches, then a join.",
                                [FlowStep(n, after=()) for n in names]
                                + [FlowStep("join", after=names)]))
    return executor


def fan_out(args: argparse.Namespace) -> None:
    delay = 0.1
    executor = fan_out_executor(delay)
    repeats = max(args.repeats, 3)

    async def concurrent() -> list[float]:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            result = await executor.execute_flow_async("fan_out", {"x": 1})
            times.append(time.perf_counter() - started)
            if result.final_output != {"total": 4}:
                sys.exit(f"consistency check failed: {result}")
        return times

    times = asyncio.run(concurrent())
    sequential = []
    for _ in range(max(repeats // 3, 1)):
        started = time.perf_counter()
        executor.execute_flow("fan_out", {"x": 1})
        sequential.append(time.perf_counter() - started)
    best, median = min(times), statistics.median(times)
    ratio = best / delay
    print(f"\nFan-out: 4 async branches awaiting {delay * 1000:.0f} ms each, then a join "
          f"({repeats} runs)")
    print(f"  longest branch          {delay * 1000:8.2f} ms")
    print(f"  execute_flow_async      {best * 1000:8.2f} / {median * 1000:8.2f} ms "
          "(best / median)")
    print(f"  execute_flow (one at a time) {min(sequential) * 1000:8.2f} ms")
    print(f"  ratio execute_flow_async / longest branch {ratio:5.2f}x {verdict(ratio, 1.5)}")


# ------------------------------------------------------------------ 4. 100-step DAG


class Pair(BaseModel):
    a: int = 0
    b: int = 0


class Value(BaseModel):
    value: int


def add(model: Pair) -> dict:
    return {"value": (model.a + model.b + 1) % 1000}


STEPS = 100


def dag_steps() -> list[FlowStep]:
    """Step i runs after step i-1 and step i//2 (a DAG with long and short edges)."""
    steps = [FlowStep("add", {"a": "seed"}, id="s0", output_mapping={"v0": "value"})]
    for i in range(1, STEPS):
        after = sorted({f"s{i - 1}", f"s{i // 2}"})
        steps.append(FlowStep("add", {"a": f"v{i - 1}", "b": f"v{i // 2}"}, id=f"s{i}",
                              after=after, output_mapping={f"v{i}": "value"}))
    return steps


def dag_by_hand(seed: int) -> int:
    context = {"seed": seed}
    context["v0"] = Value.model_validate(add(Pair.model_validate({"a": seed}))).model_dump()[
        "value"]
    for i in range(1, STEPS):
        model = Pair.model_validate({"a": context[f"v{i - 1}"], "b": context[f"v{i // 2}"]})
        context[f"v{i}"] = Value.model_validate(add(model)).model_dump()["value"]
    return context[f"v{STEPS - 1}"]


def dag(args: argparse.Namespace) -> None:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(Tool("add", "Add.", Pair, Value, add))
    seed_model = type("Seed", (BaseModel,), {"__annotations__": {"seed": int}})
    final_model = type("Final", (BaseModel,), {"__annotations__": {f"v{STEPS - 1}": int}})
    registry.register_flow(Flow("dag100", "A 100-step DAG.", dag_steps(),
                                input_schema=seed_model, output_schema=final_model))
    result = executor.execute_flow("dag100", {"seed": 3})
    if result.final_output != {f"v{STEPS - 1}": dag_by_hand(3)}:
        sys.exit(f"consistency check failed: {result.final_output}")
    number = max(args.number // 50, 5)
    timings = side_by_side({
        "hand": lambda: dag_by_hand(3),
        "flow": lambda: executor.execute_flow("dag100", {"seed": 3}),
    }, number, args.repeats)
    asyncio.run(executor.execute_flow_async("dag100", {"seed": 3}))
    if executor.plans_compiled != 1:
        sys.exit(f"consistency check failed: the plan was compiled "
                 f"{executor.plans_compiled} times")
    hand, flow = timings["hand"][0] / STEPS, timings["flow"][0] / STEPS
    print(f"\n{STEPS}-step DAG, {args.repeats} repeats; microseconds per step (best)")
    print(f"  hand-written pydantic   {hand:8.2f} us per step")
    print(f"  execute_flow            {flow:8.2f} us per step")
    print(f"  plan compilations       {executor.plans_compiled} (for all runs, both lanes)")
    print(f"  ratio per step / hand-written           {flow / hand:5.2f}x "
          f"{verdict(flow / hand, 2)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=5000)
    parser.add_argument("--no-upstream", action="store_true",
                        help="skip the comparison with the upstream reference package")
    parser.add_argument("--profile", action="store_true", help="cProfile execute_flow")
    args = parser.parse_args()
    ours = linear(args)
    if not args.no_upstream:
        upstream(args, ours)
    fan_out(args)
    dag(args)


if __name__ == "__main__":
    main()
