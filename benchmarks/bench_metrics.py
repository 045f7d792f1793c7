"""The cost of metrics on a flow call: the same calls with the server's meter provider
a no-op (metrics off) and an SDK provider with an in-memory reader (metrics on), in one
run, interleaved so both see the same machine. Prints the median time per call and
the ratio on/off.

    python benchmarks/bench_metrics.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from fastmcp import Client
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer, ServingConfig


@tool(safety=ToolSafetyContract("read"))
def echo(text: str) -> dict[str, str]:
    return {"text": text}


def server(provider: object) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    executor.registry.register_flow(Flow("echo_flow", "Echo.", [FlowStep("echo")]))
    return FlowServer(executor, serving=ServingConfig(run_notifications=False),
                      meter_provider=provider)


async def per_call(flow_server: FlowServer, calls: int) -> float:
    async with Client(flow_server.fastmcp) as client:
        await client.call_tool("echo_flow", {"text": "warm"})
        started = time.perf_counter()
        for _ in range(calls):
            await client.call_tool("echo_flow", {"text": "hi"})
        return (time.perf_counter() - started) / calls


async def main(calls: int, rounds: int) -> None:
    off = server(NoOpMeterProvider())
    on = server(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        times["off"].append(await per_call(off, calls))
        times["on"].append(await per_call(on, calls))
    off_ms = statistics.median(times["off"]) * 1000
    on_ms = statistics.median(times["on"]) * 1000
    print(f"tools/call, {calls} calls x {rounds} rounds (median per call)")
    print(f"  metrics off: {off_ms:.3f} ms")
    print(f"  metrics on:  {on_ms:.3f} ms")
    print(f"  ratio on/off: {on_ms / off_ms:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.rounds))
