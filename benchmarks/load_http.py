"""Bounded HTTP load run: a FlowServer vs. a bare FastMCP server with equivalent components.

N concurrent MCP clients mix ``tools/call``, ``resources/read`` and ``prompts/get`` against
each server, running as a subprocess on 127.0.0.1 over streamable HTTP. Three targets:

- ``bare``: FastMCP with hand-written tools, schema resources and prompts doing the
  same work as the flows;
- ``flow``: a FlowServer publishing three flows, with ``expose_schemas`` and
  ``expose_prompts``;
- ``flow+gate``: the same FlowServer with a bearer-token authenticator, a rate limiter
  and an audit hook (into a bounded in-memory buffer).

Targets run in alternating order over ``--rounds`` rounds, each limited by a request
count and by time. Printed per target: requests/s, p50/p95/p99 latency, error count
(target 0), the flow/bare throughput ratio (target >= 0.8) and the server's RSS before
and after the measured run (target: growth of a few MB at most). The client runs in
this process, so it shares the machine's cores with the servers.

Run: ``python benchmarks/load_http.py [--clients N] [--requests N] [--duration S]
[--rounds N] [--mode auto|legacy] [--quick]``. Exit status 1 if any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_common import (
    HOST,
    drive,
    load_test_parser,
    machine_line,
    percentile,
    start_server,
    stop_servers,
)
from pydantic import BaseModel, Field

TOKEN = "bench-token"
TARGETS = ("bare", "flow", "flow+gate")


# ---------------------------------------------------------------- components


class SearchInput(BaseModel):
    query: str = Field(description="What to look for", examples=["lamp"])
    limit: int = Field(5, ge=1, le=50, description="Maximum number of results")


class SearchOutput(BaseModel):
    items: list[str]
    total: int


class QuoteInput(BaseModel):
    sku: str = Field(description="Product SKU")
    quantity: int = Field(1, ge=1)


class Quote(BaseModel):
    sku: str
    total_cents: int


class OrderInput(BaseModel):
    order_id: str = Field(description="Order number", pattern=r"^A-\d+$")


class OrderRecord(BaseModel):
    order_id: str
    status: str
    carrier: str


class OrderStatus(BaseModel):
    order_id: str
    status: str
    summary: str


def search(data: SearchInput) -> SearchOutput:
    items = [f"{data.query} #{i}" for i in range(min(data.limit, 3))]
    return SearchOutput(items=items, total=len(items))


async def quote(data: QuoteInput) -> Quote:
    await asyncio.sleep(0)
    return Quote(sku=data.sku, total_cents=999 * data.quantity)


def fetch(order_id: str) -> OrderRecord:
    return OrderRecord(order_id=order_id, status="shipped", carrier="DHL")


def summarise(order_id: str, status: str, carrier: str) -> OrderStatus:
    return OrderStatus(order_id=order_id, status=status,
                       summary=f"Order {order_id} is {status} with {carrier}.")


FLOWS = {"product_search": (SearchInput, SearchOutput, "Search the catalogue."),
         "price_quote": (QuoteInput, Quote, "Quote a price."),
         "order_status": (OrderInput, OrderStatus, "Look up and summarise an order.")}


def flow_server(gated: bool) -> Any:
    from chainweaver import (
        Flow,
        FlowExecutor,
        FlowRegistry,
        FlowStep,
        SideEffectLevel,
        ToolSafetyContract,
        tool,
    )
    from chainweaver.mcp import (
        CallerIdentity,
        FixedWindowRateLimiter,
        FlowServer,
        SecurityConfig,
        ServingConfig,
    )

    read = ToolSafetyContract(SideEffectLevel.READ)
    executor = FlowExecutor(FlowRegistry())
    for fn in (search, quote, fetch, summarise):
        executor.register_tool(tool(safety=read)(fn))
    steps = {"product_search": ["search"], "price_quote": ["quote"],
             "order_status": ["fetch", "summarise"]}
    for name, (inp, out, about) in FLOWS.items():
        executor.registry.register_flow(Flow(name, about, [FlowStep(s) for s in steps[name]],
                                             input_schema=inp, output_schema=out))
    options: dict[str, Any] = {}
    if gated:
        audit: collections.deque = collections.deque(maxlen=1000)  # bounded, like a sink

        def authenticate(ctx: Any) -> CallerIdentity | None:
            ok = ctx.headers.get("authorization") == f"Bearer {TOKEN}"
            return CallerIdentity("bench") if ok else None

        options = {"authenticator": authenticate, "audit_hook": audit.append,
                   "rate_limiter": FixedWindowRateLimiter(10**9, 60)}
    return FlowServer(executor, expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(**options),
                      serving=ServingConfig(name="bench-flow"))


def constant(text: str) -> Any:
    """A resource function returning ``text`` (no parameters, so not a template)."""

    def read() -> str:
        return text

    return read


def bare_server() -> Any:
    """FastMCP components doing what the FlowServer's do, written by hand."""
    from fastmcp import FastMCP

    mcp = FastMCP("bench-bare")

    @mcp.tool
    def product_search(query: str, limit: int = 5) -> SearchOutput:
        """Search the catalogue."""
        return search(SearchInput(query=query, limit=limit))

    @mcp.tool
    async def price_quote(sku: str, quantity: int = 1) -> Quote:
        """Quote a price."""
        return await quote(QuoteInput(sku=sku, quantity=quantity))

    @mcp.tool
    def order_status(order_id: str) -> OrderStatus:
        """Look up and summarise an order."""
        data = OrderInput(order_id=order_id)
        record = fetch(data.order_id)
        return summarise(record.order_id, record.status, record.carrier)

    index = []
    for name, (inp, out, about) in FLOWS.items():
        document = json.dumps({"name": name, "description": about, "tool_name": name,
                               "input_schema": inp.model_json_schema(),
                               "output_schema": out.model_json_schema()}, indent=2)
        mcp.resource(f"bench://flows/{name}/schema", name=f"{name}_schema",
                     mime_type="application/json")(constant(document))
        index.append({"name": name, "schema_uri": f"bench://flows/{name}/schema"})
    index_text = json.dumps({"flows": index}, indent=2)
    mcp.resource("bench://flows", name="flows", mime_type="application/json")(
        constant(index_text))

    def invocation(name: str, arguments: dict[str, Any]) -> str:
        inp = FLOWS[name][0]
        checked = inp.model_validate(arguments).model_dump()
        return (f"Call the tool `{name}`: {FLOWS[name][2]}\nArguments:\n"
                f"<user-data name=\"arguments\">{json.dumps(checked, indent=2)}</user-data>")

    @mcp.prompt(name="product_search")
    def search_prompt(query: str, limit: str = "5") -> str:
        return invocation("product_search", {"query": query, "limit": int(limit)})

    @mcp.prompt(name="price_quote")
    def quote_prompt(sku: str, quantity: str = "1") -> str:
        return invocation("price_quote", {"sku": sku, "quantity": int(quantity)})

    @mcp.prompt(name="order_status")
    def order_prompt(order_id: str) -> str:
        return invocation("order_status", {"order_id": order_id})

    return mcp


def serve(kind: str, port: int) -> None:
    if kind == "bare":
        asyncio.run(bare_server().run_async("streamable-http", host=HOST, port=port,
                                            show_banner=False, log_level="warning"))
    else:
        flow_server(gated=kind == "flow+gate").serve("streamable-http", host=HOST, port=port,
                                                     log_level="warning")


# ------------------------------------------------------------------- the load


def requests_for(kind: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The request mix: (primitive, name or URI, arguments); 3 tools : 2 reads : 2 prompts."""
    scheme = "bench" if kind == "bare" else "chainweaver"
    return [
        ("tool", "product_search", {"query": "lamp", "limit": 3}),
        ("resource", f"{scheme}://flows/price_quote/schema", {}),
        ("prompt", "product_search", {"query": "desk lamp", "limit": "3"}),
        ("tool", "price_quote", {"sku": "SKU-1", "quantity": 2}),
        ("resource", f"{scheme}://flows", {}),
        ("prompt", "order_status", {"order_id": "A-17"}),
        ("tool", "order_status", {"order_id": "A-17"}),
    ]


async def one_request(client: Any, primitive: str, name: str, arguments: dict) -> bool:
    """Send one request; True if it succeeded with a plausible answer."""
    from mcp import MCPError

    try:
        if primitive == "tool":
            result = await client.call_tool(name, arguments, raise_on_error=False)
            return not result.is_error and result.structured_content is not None
        if primitive == "resource":
            return bool(json.loads((await client.read_resource(name))[0].text))
        result = await client.get_prompt(name, arguments)
        return "user-data" in result.messages[0].content.text
    except (MCPError, ValueError):
        return False


async def load(url: str, kind: str, clients: int, count: int, seconds: float,
               mode: str) -> tuple[list[float], int, float]:
    """``clients`` concurrent clients sending ``count`` requests of ``kind``'s mix in all,
    at most ``seconds`` long."""
    mix = requests_for(kind)

    async def request(client: Any, n: int) -> bool:
        return await one_request(client, *mix[n % len(mix)])

    return await drive(url, [TOKEN], clients, count, seconds, mode, request)


# ---------------------------------------------------------------- processes


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def parse_args() -> argparse.Namespace:
    parser = load_test_parser(__doc__.split("\n\n")[0], "requests")
    parser.add_argument("--serve", choices=TARGETS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.clients, args.requests, args.duration = 2, 42, 30.0
        args.rounds, args.warmup = 1, 14
    return args


async def measure(args: argparse.Namespace, ports: dict[str, int],
                  pids: dict[str, int]) -> dict[str, dict[str, Any]]:
    stats = {kind: {"latencies": [], "errors": 0, "elapsed": 0.0, "rates": [],
                    "rss_rounds": []} for kind in TARGETS}
    urls = {kind: f"http://{HOST}:{port}/mcp" for kind, port in ports.items()}
    for kind in TARGETS:  # warm up: imports, caches, first connections
        await load(urls[kind], kind, args.clients, args.warmup, args.duration, args.mode)
        stats[kind]["rss_before"] = rss_kib(pids[kind])
    for round_ in range(args.rounds):
        order = TARGETS if round_ % 2 == 0 else tuple(reversed(TARGETS))
        for kind in order:
            latencies, errors, elapsed = await load(urls[kind], kind, args.clients,
                                                    args.requests, args.duration, args.mode)
            stats[kind]["latencies"] += latencies
            stats[kind]["errors"] += errors
            stats[kind]["elapsed"] += elapsed
            stats[kind]["rates"].append(len(latencies) / elapsed)
            stats[kind]["rss_rounds"].append(rss_kib(pids[kind]))
    for kind in TARGETS:
        stats[kind]["rss_after"] = rss_kib(pids[kind])
    return stats


def report(args: argparse.Namespace, stats: dict[str, dict[str, Any]]) -> int:
    print("== load_http ==")
    print(machine_line())
    print(f"clients={args.clients} requests/target/round={args.requests} "
          f"duration cap={args.duration:g}s rounds={args.rounds} mode={args.mode} "
          f"mix=3 tools/call : 2 resources/read : 2 prompts/get")
    print("\n== throughput and latency ==")
    print("req/s: median over rounds (range); latency over all rounds")
    print(f"{'target':<10} {'requests':>8} {'errors':>6} {'req/s':>8} {'p50 ms':>8} "
          f"{'p95 ms':>8} {'p99 ms':>8}  range req/s")
    rates = {}
    for kind in TARGETS:
        s = stats[kind]
        lat = s["latencies"]
        # The median round resists bursts of load from other processes on the machine.
        rates[kind] = statistics.median(s["rates"])
        print(f"{kind:<10} {len(lat):>8} {s['errors']:>6} {rates[kind]:>8.1f} "
              f"{percentile(lat, 0.50) * 1000:>8.2f} {percentile(lat, 0.95) * 1000:>8.2f} "
              f"{percentile(lat, 0.99) * 1000:>8.2f}  "
              f"{min(s['rates']):.0f}-{max(s['rates']):.0f}")
    print("\n== ratio ==")
    for kind in ("flow", "flow+gate"):
        ratio = rates[kind] / rates["bare"] if rates["bare"] else 0.0
        verdict = "meets" if ratio >= 0.8 else "below"
        print(f"{kind} / bare throughput: {ratio:.2f}x ({verdict} the 0.8x target)")
    print("\n== memory (server RSS) ==")
    for kind in TARGETS:
        before, after = stats[kind]["rss_before"], stats[kind]["rss_after"]
        rounds = " ".join(f"{kib / 1024:.1f}" for kib in stats[kind]["rss_rounds"])
        print(f"{kind:<10} before {before / 1024:7.1f} MiB  after {after / 1024:7.1f} MiB  "
              f"growth {(after - before) / 1024:+6.1f} MiB  (after each round: {rounds})")
    errors = sum(stats[kind]["errors"] for kind in TARGETS)
    print(f"\n== result ==\nerrors: {errors} (target 0); "
          f"median latency flow {statistics.median(stats['flow']['latencies']) * 1000:.2f} ms")
    return 1 if errors else 0


def main() -> int:
    args = parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return 0
    processes: dict[str, subprocess.Popen] = {}
    try:
        ports = {}
        for kind in TARGETS:
            processes[kind], ports[kind] = start_server(__file__, kind)
        pids = {kind: process.pid for kind, process in processes.items()}
        stats = asyncio.run(measure(args, ports, pids))
    finally:
        stop_servers(processes)
    return report(args, stats)


if __name__ == "__main__":
    sys.exit(main())
