"""Does a flow outside the caller's view answer in the same time as a name that never
existed? (issue 15: "indistinguishable ... timing class").

One FlowServer over an in-memory ``fastmcp.Client`` (2026-07-28) publishes 200 flows
owned by 20 teams, with per-caller views (``visible_claim("teams")``, the caller named by
an ``authenticator`` hook) and schema resources and prompts on. The caller's team owns
10 of the flows. For ``tools/call``, ``resources/read`` and ``prompts/get`` it times
requests for a published flow outside the caller's view against requests for a name
that never existed (both are refused with the same error), taken in turns in chunks so
noise hits both; a flow inside the view is timed too, for scale. Printed: median
microseconds per request and the hidden / never-existed ratio (close to 1.0: the same
timing class; the two paths differ by one cached view lookup).

Run: ``python benchmarks/bench_hidden.py [--chunks N] [--number N]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench_common import ignore_log
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import CallerIdentity, FlowServer, GateContext, SecurityConfig, visible_claim

TEAMS = 20
FLOWS = 200


class Query(BaseModel):
    query: str


class Answer(BaseModel):
    answer: str


@tool(safety=ToolSafetyContract("read"))
def lookup(data: Query) -> Answer:
    """Look something up."""
    return Answer(answer=data.query.upper())


def build_executor() -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(lookup)
    for n in range(FLOWS):
        executor.registry.register_flow(Flow(
            f"flow_{n:03d}", "Look something up.", [FlowStep("lookup")], version="1.0.0",
            governance=FlowGovernance(owner=f"team-{n % TEAMS}")))
    return executor


def caller(context: GateContext) -> CallerIdentity:
    return CallerIdentity("sam", {"teams": ["team-0"]}, subject="sam")



async def timed(request: Callable[[], Awaitable[Any]], number: int) -> float:
    """Median microseconds of ``number`` requests (a refusal counts as an answer)."""
    samples = []
    for _ in range(number):
        started = time.perf_counter()
        try:
            await request()
        except MCPError:
            pass
        samples.append((time.perf_counter() - started) * 1e6)
    return statistics.median(samples)


async def refusal(request: Callable[[], Awaitable[Any]]) -> str | None:
    """The error a request is refused with (None: it was answered)."""
    try:
        result = await request()
    except MCPError as error:
        return f"{error.error.code} {error.error.message}"
    if getattr(result, "is_error", False):
        return f"isError {result.content[0].text}"
    return None


def requests(client: Client, name: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    uri = f"chainweaver://flows/{name}/schema"
    return {
        "tools/call": lambda: client.call_tool_mcp(name, {"query": "lamp"}),
        "resources/read": lambda: client.read_resource_mcp(uri),
        "prompts/get": lambda: client.get_prompt_mcp(name, {"query": "lamp"}),
    }


async def main(chunks: int, number: int) -> None:
    server = FlowServer(build_executor(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(authenticator=caller,
                                                visible=visible_claim("teams")))
    targets = {"visible": "flow_000", "hidden": "flow_001", "never existed": "flow_zzz"}
    async with Client(server.fastmcp, log_handler=ignore_log) as client:
        kinds = {label: requests(client, name) for label, name in targets.items()}
        for label in targets:  # warm: views, components and caches built once
            for request in kinds[label].values():
                await timed(request, 5)
        for kind in ("tools/call", "resources/read", "prompts/get"):
            hidden = await refusal(kinds["hidden"][kind])
            never = await refusal(kinds["never existed"][kind])
            if hidden is None or hidden != never.replace("flow_zzz", "flow_001"):
                raise SystemExit(f"{kind}: a hidden flow answers {hidden!r}, a name that "
                                 f"never existed {never!r}")
        print(f"{FLOWS} flows, the caller sees {FLOWS // TEAMS}; median us per request "
              f"({chunks} chunks of {number}, taken in turns)")
        for kind in ("tools/call", "resources/read", "prompts/get"):
            medians: dict[str, list[float]] = {label: [] for label in targets}
            for chunk in range(chunks):
                order = list(targets) if chunk % 2 == 0 else list(reversed(targets))
                for label in order:
                    medians[label].append(await timed(kinds[label][kind], number))
            result = {label: statistics.median(values) for label, values in medians.items()}
            ratio = result["hidden"] / result["never existed"]
            print(f"  {kind:15} visible {result['visible']:8.1f}   hidden "
                  f"{result['hidden']:8.1f}   never existed {result['never existed']:8.1f}"
                  f"   hidden / never existed {ratio:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--number", type=int, default=50)
    parsed = parser.parse_args()
    asyncio.run(main(parsed.chunks, parsed.number))
