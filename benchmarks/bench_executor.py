"""Executor overhead: a 3-step flow of trivial pydantic tools vs. hand-written validation.

The baseline does what any careful caller would do without ChainWeaver: for each of the
three tools, ``model_validate`` its input, call it, ``model_validate`` its output.
The executor additionally builds the step context, records each step and times it.

Run: ``python benchmarks/bench_executor.py [--repeats N] [--number N] [--profile]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable

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


def best_and_median(run: Callable[[], object], number: int, repeats: int) -> tuple[float, float]:
    """Microseconds per call: best and median over ``repeats`` batches of ``number`` calls."""
    for _ in range(max(number // 10, 100)):  # warm up (caches, plans, branch predictors)
        run()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(number):
            run()
        samples.append((time.perf_counter() - started) / number * 1e6)
    return min(samples), statistics.median(samples)


def async_batches(executor: FlowExecutor, number: int, repeats: int) -> tuple[float, float]:
    """Like :func:`best_and_median`, for ``await execute_flow_async`` inside one event loop."""

    async def main() -> tuple[float, float]:
        for _ in range(max(number // 10, 100)):
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
    """Best microseconds for one empty ``run_in_executor`` hop on the executor's pool."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        pool = executor._thread_pool()
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(number):
                await loop.run_in_executor(pool, int)
            samples.append((time.perf_counter() - started) / number * 1e6)
        return min(samples)

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=5000)
    parser.add_argument("--profile", action="store_true", help="cProfile execute_flow")
    args = parser.parse_args()

    executor = build_executor()
    result = executor.execute_flow("classify", FLOW_INPUT)
    assert result.success and result.final_output == hand_written(FLOW_INPUT), result

    def run_flow() -> object:
        return executor.execute_flow("classify", FLOW_INPUT)

    def run_hand() -> object:
        return hand_written(FLOW_INPUT)

    hand_best, hand_median = best_and_median(run_hand, args.number, args.repeats)
    flow_best, flow_median = best_and_median(run_flow, args.number, args.repeats)
    async_number = max(args.number // 5, 1)
    async_best, async_median = async_batches(executor, async_number, args.repeats)
    hop = thread_hop(executor, async_number, args.repeats)

    print(f"3-step flow, {args.repeats} repeats; microseconds per call (best / median)")
    print(f"  hand-written pydantic   {hand_best:8.2f} / {hand_median:8.2f} us")
    print(f"  execute_flow            {flow_best:8.2f} / {flow_median:8.2f} us")
    print(f"  execute_flow_async      {async_best:8.2f} / {async_median:8.2f} us")
    ratio = flow_best / hand_best
    print(f"  ratio execute_flow / hand-written        {ratio:5.2f}x "
          f"(target <= 3x: {'ok' if ratio <= 3 else 'OVER'})")
    print(f"  ratio execute_flow_async / hand-written  {async_best / hand_best:5.2f}x "
          "(includes one worker-thread hop per run)")
    print(f"  of which an empty worker-thread hop costs {hop:8.2f} us "
          f"(async minus hop: {async_best - hop:.2f} us)")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.number):
            run_flow()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
