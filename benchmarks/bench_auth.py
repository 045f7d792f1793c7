"""tools/call over streamable HTTP with JWT bearer tokens: a FlowServer with per-caller
views vs. bare FastMCP with the same JWT verifier.

Both servers run as subprocesses on 127.0.0.1 and verify RS256 tokens with FastMCP's
``JWTVerifier`` (a PEM public key, issuer and audience). Two targets:

- ``bare``: FastMCP with one hand-written tool doing the flow's work;
- ``views``: a FlowServer publishing that flow among 200 others owned by other teams,
  with ``visible=visible_claim("teams")``: each caller sees only its teams' flows.

Clients are four callers with two different grant sets, each allowed to call the flow.
Targets run in alternating order over ``--rounds`` rounds, each bounded by a request
count and by time. Printed: requests/s (median round), p50/p95 latency, errors (target
0) and the views/bare throughput ratio (target >= 0.8).

Run: ``python benchmarks/bench_auth.py [--clients N] [--requests N] [--rounds N]
[--mode auto|legacy] [--quick]``. Exit status 1 if any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
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

ISSUER = "https://issuer.bench"
AUDIENCE = "chainweaver-bench"
TARGETS = ("bare", "views")
OTHER_FLOWS = 200
# (subject, teams): two grant sets, both holding the quoted flow's owner.
CALLERS = [("ana", ["pricing-team"]), ("ben", ["pricing-team"]),
           ("cho", ["pricing-team", "team-3"]), ("dee", ["pricing-team", "team-3"])]


class QuoteInput(BaseModel):
    sku: str = Field(description="Product SKU")
    quantity: int = Field(1, ge=1)


class Quote(BaseModel):
    sku: str
    total_cents: int


async def quote(data: QuoteInput) -> Quote:
    await asyncio.sleep(0)
    return Quote(sku=data.sku, total_cents=999 * data.quantity)


def verifier(key_file: str) -> Any:
    from fastmcp.server.auth.providers.jwt import JWTVerifier

    return JWTVerifier(public_key=Path(key_file).read_text(), issuer=ISSUER,
                       audience=AUDIENCE)


def views_server(key_file: str, run_notifications: bool = True) -> Any:
    from chainweaver import (
        Flow,
        FlowExecutor,
        FlowGovernance,
        FlowRegistry,
        FlowStep,
        SideEffectLevel,
        ToolSafetyContract,
        tool,
    )
    from chainweaver.mcp import FlowServer, SecurityConfig, ServingConfig, visible_claim

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(tool(safety=ToolSafetyContract(SideEffectLevel.READ))(quote))
    executor.registry.register_flow(Flow(
        "price_quote", "Quote a price.", [FlowStep("quote")], input_schema=QuoteInput,
        output_schema=Quote, governance=FlowGovernance(owner="pricing-team")))
    for number in range(OTHER_FLOWS):
        executor.registry.register_flow(Flow(
            f"quote_{number}", "Quote a price.", [FlowStep("quote")], input_schema=QuoteInput,
            output_schema=Quote, governance=FlowGovernance(owner=f"team-{number % 7}")))
    return FlowServer(executor,
                      security=SecurityConfig(auth=verifier(key_file),
                                              visible=visible_claim("teams")),
                      serving=ServingConfig(name="bench-views",
                                            run_notifications=run_notifications))


def bare_server(key_file: str) -> Any:
    from fastmcp import FastMCP

    mcp = FastMCP("bench-bare", auth=verifier(key_file))

    @mcp.tool
    async def price_quote(sku: str, quantity: int = 1) -> Quote:
        """Quote a price."""
        return await quote(QuoteInput(sku=sku, quantity=quantity))

    return mcp


def serve(kind: str, port: int, key_file: str, run_notifications: bool = True) -> None:
    if kind == "bare":
        bare_server(key_file).run("streamable-http", host=HOST, port=port, show_banner=False,
                                  log_level="ERROR")
    else:
        views_server(key_file, run_notifications).serve("streamable-http", host=HOST, port=port,
                                     log_level="ERROR")


# ---------------------------------------------------------------- load


def tokens(private_key: Any) -> list[str]:
    import jwt

    now = int(time.time())
    return [jwt.encode({"sub": subject, "iss": ISSUER, "aud": AUDIENCE, "iat": now,
                        "exp": now + 3600, "teams": teams, "client_id": "bench"},
                       private_key, algorithm="RS256") for subject, teams in CALLERS]


async def price_quote(client: Any, n: int) -> bool:
    """One ``price_quote`` call; True when it answered the right quote."""
    from mcp import MCPError

    try:
        result = await client.call_tool("price_quote", {"sku": f"S-{n}"}, raise_on_error=False)
    except MCPError:
        return False
    return not result.is_error and result.structured_content == {"sku": f"S-{n}",
                                                                 "total_cents": 999}


async def load(url: str, bearer: list[str], clients: int, count: int, seconds: float,
               mode: str) -> tuple[list[float], int, float]:
    """``clients`` concurrent callers (their tokens taken in turn from ``bearer``) sending
    ``count`` calls in all, at most ``seconds`` long."""
    return await drive(url, bearer, clients, count, seconds, mode, price_quote)


def parse_args() -> argparse.Namespace:
    parser = load_test_parser(__doc__.split("\n\n")[0], "calls")
    parser.add_argument("--quiet-runs", action="store_true",
                        help="the views server sends no per-step progress or log messages "
                             "(ServingConfig(run_notifications=False)); FastMCP's client "
                             "asks for both on every call, and bare FastMCP sends none")
    parser.add_argument("--serve", choices=TARGETS, help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.clients, args.requests, args.duration = 4, 40, 30.0
        args.rounds, args.warmup = 1, 8
    return args


async def measure(args: argparse.Namespace, ports: dict[str, int], bearer: list[str]
                  ) -> dict[str, dict[str, Any]]:
    stats: dict[str, dict[str, Any]] = {
        kind: {"latencies": [], "errors": 0, "rates": []} for kind in TARGETS}
    urls = {kind: f"http://{HOST}:{port}/mcp" for kind, port in ports.items()}
    for kind in TARGETS:  # warm up: imports, caches, first connections
        await load(urls[kind], bearer, args.clients, args.warmup, args.duration, args.mode)
    for round_ in range(args.rounds):
        for kind in TARGETS if round_ % 2 == 0 else tuple(reversed(TARGETS)):
            latencies, errors, elapsed = await load(urls[kind], bearer, args.clients,
                                                    args.requests, args.duration, args.mode)
            stats[kind]["latencies"] += latencies
            stats[kind]["errors"] += errors
            stats[kind]["rates"].append(len(latencies) / elapsed)
    return stats


def report(args: argparse.Namespace, stats: dict[str, dict[str, Any]]) -> int:
    print("== bench_auth ==")
    print(machine_line())
    print(f"clients={args.clients} calls/target/round={args.requests} rounds={args.rounds} "
          f"mode={args.mode}; RS256 JWTs, {len(CALLERS)} callers in 2 grant sets; views "
          f"server: 1 visible flow among {OTHER_FLOWS + 1}")
    print("\n== tools/call throughput and latency ==")
    print(f"{'target':<8} {'calls':>7} {'errors':>6} {'req/s':>8} {'p50 ms':>8} "
          f"{'p95 ms':>8}  range req/s")
    rates = {}
    for kind in TARGETS:
        s = stats[kind]
        lat = s["latencies"]
        rates[kind] = statistics.median(s["rates"])
        print(f"{kind:<8} {len(lat):>7} {s['errors']:>6} {rates[kind]:>8.1f} "
              f"{percentile(lat, 0.50) * 1000:>8.2f} {percentile(lat, 0.95) * 1000:>8.2f}  "
              f"{min(s['rates']):.0f}-{max(s['rates']):.0f}")
    ratio = rates["views"] / rates["bare"] if rates["bare"] else 0.0
    verdict = "meets" if ratio >= 0.8 else "below"
    print("\n== ratio ==")
    print(f"views / bare throughput: {ratio:.2f}x ({verdict} the 0.8x target)")
    errors = sum(stats[kind]["errors"] for kind in TARGETS)
    print(f"\n== result ==\nerrors: {errors} (target 0)")
    return 1 if errors else 0


def main() -> int:
    args = parse_args()
    if args.serve:
        serve(args.serve, args.port, args.key, not args.quiet_runs)
        return 0
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    processes: dict[str, subprocess.Popen] = {}
    with tempfile.TemporaryDirectory() as directory:
        key_file = str(Path(directory) / "public.pem")
        Path(key_file).write_bytes(private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        try:
            ports = {}
            for kind in TARGETS:
                processes[kind], ports[kind] = start_server(
                    __file__, kind, "--key", key_file,
                    *(["--quiet-runs"] if args.quiet_runs else []))
            stats = asyncio.run(measure(args, ports, tokens(private_key)))
        finally:
            stop_servers(processes)
    return report(args, stats)


if __name__ == "__main__":
    sys.exit(main())
