"""What a run that talks back costs: a 3-step flow's ``tools/call`` with per-step progress
and log notifications on, against the same call with them off, in the same run.

Both go through one FlowServer over an in-memory ``fastmcp.Client`` (2026-07-28). "On":
the call carries a progress token and asks for log messages from ``debug`` up, so every
call sends 3 progress and 6 log notifications. "Off": no progress token, and a log level
(``emergency``) that none of a run's messages reach, so the run takes the plain path.
On and off take turns in chunks (which goes first alternates), so noise hits both; the
ratios are best against best, and the median of each on chunk over the off chunk next
to it. **Target:** on <= 1.3x off.

With ``--era legacy`` the same on a 2025-11-25 connection: "on" is a client that set
``logging/setLevel debug`` and sends a progress token, "off" a second client that set
``emergency`` (both read the level the gate kept in their session state).

Run: ``python benchmarks/bench_runs.py [--repeats N] [--number N] [--era modern|legacy]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from fastmcp import Client
from mcp_types import LOG_LEVEL_META_KEY
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer

PURE = ToolSafetyContract("none")
TARGET = 1.3


class Text(BaseModel):
    text: str


class Cleaned(BaseModel):
    cleaned: str


class Counted(BaseModel):
    cleaned: str
    words: int


@tool(safety=PURE)
def clean(value: Text) -> Cleaned:
    return Cleaned(cleaned=" ".join(value.text.split()).lower())


@tool(safety=PURE)
def count(value: Cleaned) -> Counted:
    return Counted(cleaned=value.cleaned, words=len(value.cleaned.split()))


@tool(safety=PURE)
def label(value: Counted) -> Counted:
    return Counted(cleaned=value.cleaned.title(), words=value.words)


def build() -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    for t in (clean, count, label):
        executor.register_tool(t)
    executor.registry.register_flow(Flow("classify", "three steps", [
        FlowStep("clean"), FlowStep("count"), FlowStep("label")]))
    return FlowServer(executor)


class Counter:
    def __init__(self) -> None:
        self.progress = 0
        self.logs = 0

    async def on_progress(self, *args: Any) -> None:
        self.progress += 1

    async def on_log(self, message: Any) -> None:
        self.logs += 1


ARGUMENTS = {"text": "The  quick brown FOX"}
QUIET = {LOG_LEVEL_META_KEY: "emergency"}


async def timed(call: Any, number: int) -> float:
    started = time.perf_counter()
    for _ in range(number):
        await call()
    return (time.perf_counter() - started) / number


async def main(repeats: int, number: int, era: str = "modern") -> int:
    server = build()
    seen = Counter()
    chunk = max(1, number // 10)
    legacy = era == "legacy"
    mode = "legacy" if legacy else "auto"
    async with Client(server.fastmcp, log_handler=seen.on_log, mode=mode) as client, \
            Client(server.fastmcp, log_handler=seen.on_log, mode=mode) as quiet:
        if legacy:
            await client.set_logging_level("debug")
            await quiet.set_logging_level("emergency")

        async def on() -> Any:
            return await client.call_tool("classify", ARGUMENTS,
                                          progress_handler=seen.on_progress)

        async def off() -> Any:
            if legacy:
                return await quiet.call_tool("classify", ARGUMENTS)
            return await client.call_tool("classify", ARGUMENTS, meta=QUIET)

        # Consistency: same result; on sends 3 + 6 notifications per call, off none.
        first, second = await on(), await off()
        if first.structured_content != second.structured_content:
            print("FAIL: on and off return different results", file=sys.stderr)
            return 1
        seen.progress = seen.logs = 0
        await on()
        if (seen.progress, seen.logs) != (3, 6):
            print(f"FAIL: on sent {seen.progress} progress, {seen.logs} log", file=sys.stderr)
            return 1
        seen.progress = seen.logs = 0
        await off()
        if (seen.progress, seen.logs) != (0, 0):
            print("FAIL: off sent notifications", file=sys.stderr)
            return 1
        for _ in range(chunk):  # warm up both
            await on()
            await off()

        on_times: list[float] = []
        off_times: list[float] = []
        paired: list[float] = []  # each on chunk over the off chunk next to it
        for repeat in range(repeats):
            batch_on, batch_off = [], []
            for turn in range(max(1, number // chunk)):
                first, second = (on, off) if (repeat + turn) % 2 == 0 else (off, on)
                a, b = await timed(first, chunk), await timed(second, chunk)
                on_time, off_time = (a, b) if first is on else (b, a)
                batch_on.append(on_time)
                batch_off.append(off_time)
                paired.append(on_time / off_time)
            on_times.append(statistics.fmean(batch_on))
            off_times.append(statistics.fmean(batch_off))

    best = min(on_times) / min(off_times)
    median = statistics.median(paired)
    print(f"tools/call of a 3-step flow, in memory, "
          f"{'2025-11-25' if legacy else '2026-07-28'}")
    print(f"  off (no progress token, no log level): best {min(off_times) * 1e3:.3f} ms, "
          f"median {statistics.median(off_times) * 1e3:.3f} ms")
    print(f"  on  (3 progress + 6 log notifications): best {min(on_times) * 1e3:.3f} ms, "
          f"median {statistics.median(on_times) * 1e3:.3f} ms")
    print(f"  ratio on/off: best {best:.2f}x, median of paired chunks {median:.2f}x "
          f"(target <= {TARGET}x)")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=300)
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    options = parser.parse_args()
    sys.exit(asyncio.run(main(options.repeats, options.number, options.era)))
