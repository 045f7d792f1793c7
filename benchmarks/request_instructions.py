"""Requests (or runs) made after warm-up with the garbage collector frozen and off, for
counting instructions per request under valgrind, where wall-clock time is too noisy to
tell a difference of a few per cent.

One process makes ``--number`` requests of one kind on ``bench_server.py``'s catalogue:

- ``read``, ``get``, ``call``: a schema resource read, a prompt render, a ``tools/call``
  of the 3-step flow (``--non-blocking``: its tools declared ``blocking=False``, so the
  run skips the worker-thread hop);
- ``--feature history|metrics|tracing``: the server with its run history, a metrics SDK
  or a recording tracer on (what a call costs with each, against ``none``); with
  ``bare-call``, the same provider set for the bare server (FastMCP's own spans);
- ``bare-call``: the baseline of ``call``, a bare async FastMCP tool doing the same three
  validate-call-validate steps inline and sending the same per-step progress and log
  notifications a run sends (a log message as each step starts and ends, a progress
  notification as it ends);
- ``run``, ``hand``: no server; ``bench_executor.py``'s 3-step flow through
  ``FlowExecutor.execute_flow``, and the same three tools validated by hand.

The instructions of a run with none, subtracted from one with some, divided by their
number, are one request's. ``--callgrind`` does exactly that (two runs under valgrind)
and prints the count. Compare two copies of the package by ``PYTHONPATH``
(``git archive REF chainweaver | tar -x -C DIR``)::

    PYTHONHASHSEED=0 PYTHONPATH=DIR valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/request_instructions.py read --number 400

and read valgrind's ``I refs`` line, or pass ``--callgrind``. Put the copies you compare
at paths of the same length (``/tmp/cw-a``, ``/tmp/cw-b``): a path of another length
shifts a count by 10-40 k, since dictionary layouts follow the paths' hashes. See
benchmarks/README.md.

``--grants`` measures step grants (docs/step-grants.md): ``none`` (default: no
declaration, no hook: the plain path), ``hook`` (a step authorizer answering yes to every
step), ``authenticated`` (an authenticator hook, no grants: the baseline of the next) and
``declared`` (that authenticator's caller holds the scope every tool declares).

The client drops the log messages a run sends (``--render-logs`` renders them as
FastMCP's default handler does): rendering them with rich took about three quarters of
a call's count, which hid the server's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import re
import subprocess
import sys
from itertools import cycle
from typing import Any

from bench_server import ARGUMENTS, PROMPT_ARGUMENTS, bare_notifying_server, build_executor
from fastmcp import Client

from chainweaver.mcp import CallerIdentity, FlowServer, RunHistory, SecurityConfig

BENCH_CALLER = CallerIdentity("bench", scopes=frozenset({"bench"}))
GRANTS = ("none", "hook", "authenticated", "declared")


def security(grants: str, executor: object) -> SecurityConfig:
    """The server's SecurityConfig for a ``--grants`` mode (tools changed for declared).
    ``none`` uses nothing new, so the script also runs on a checkout without grants."""
    if grants == "hook":
        return SecurityConfig(step_authorizer=lambda request: True)
    if grants == "none":
        return SecurityConfig()
    if grants == "declared":
        from chainweaver import Grants

        for tool in executor.tools.values():  # type: ignore[attr-defined]
            tool.requires = Grants(frozenset({"bench"}))
    return SecurityConfig(authenticator=lambda gate: BENCH_CALLER)

KINDS = ("read", "get", "call", "bare-call", "run", "hand")
FEATURES = ("none", "history", "metrics", "tracing")


async def ignore(message: object) -> None:
    """A client log handler that drops the message (the server still sends it)."""


def quiet() -> None:
    gc.collect()
    gc.freeze()
    gc.disable()  # a collection inside the count would decide it


def features(feature: str) -> dict[str, Any]:
    """The server's keywords with one feature on (``none``: every one off)."""
    if feature == "history":
        return {"run_history": RunHistory()}
    if feature == "metrics":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        return {"meter_provider": MeterProvider(metric_readers=[InMemoryMetricReader()])}
    if feature == "tracing":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())  # records spans, exports none
    return {}


async def serve(kind: str, number: int, flows: int, render_logs: bool,
                non_blocking: bool, feature: str = "none", grants: str = "none") -> None:
    handler = None if render_logs else ignore
    if kind == "bare-call":
        # A tracer (or meter) provider set for the bare server too: what FastMCP's own
        # spans cost, so a call's difference is ChainWeaver's share.
        features(feature)
        async with Client(bare_notifying_server("classify_0001"),
                          log_handler=handler) as client:
            for _ in range(50):
                await client.call_tool("classify_0001", ARGUMENTS)
            quiet()
            for _ in range(number):
                await client.call_tool("classify_0001", ARGUMENTS)
        return
    executor = build_executor(flows, blocking=not non_blocking)
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        security=security(grants, executor), **features(feature))
    async with Client(server.fastmcp, log_handler=handler) as client:
        uris = cycle([str(r.uri) for r in await client.list_resources()]).__next__
        names = cycle([p.name for p in await client.list_prompts() if p.arguments]).__next__
        for _ in range(flows):  # every schema document serialised, every prompt built
            await client.read_resource(uris())
            await client.get_prompt(names(), PROMPT_ARGUMENTS)
        for _ in range(50):
            await client.call_tool("classify_0001", ARGUMENTS)
        quiet()
        for _ in range(number):
            if kind == "call":
                await client.call_tool("classify_0001", ARGUMENTS)
            elif kind == "read":
                await client.read_resource(uris())
            else:
                await client.get_prompt(names(), PROMPT_ARGUMENTS)


def run_locally(kind: str, number: int) -> None:
    """``run`` or ``hand``: bench_executor.py's 3-step flow, no server."""
    from bench_executor import FLOW_INPUT, hand_written
    from bench_executor import build_executor as executor_of

    executor = executor_of()
    if kind == "run":
        def once() -> object:
            return executor.execute_flow("classify", FLOW_INPUT)
    else:
        def once() -> object:
            return hand_written(FLOW_INPUT)
    for _ in range(200):
        once()
    quiet()
    for _ in range(number):
        once()


def callgrind(argv: list[str], number: int) -> float:
    """Instructions per request: two runs of this script under valgrind, ``number``
    requests and none, the difference divided by ``number``."""
    counts = []
    for requests in (number, 0):
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                   sys.executable, __file__, *argv, "--number", str(requests)]
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0"})
        found = re.search(r"refs:\s+([\d,]+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise RuntimeError(f"valgrind run failed: {done.stderr[-2000:]}")
        counts.append(int(found.group(1).replace(",", "")))
    return (counts[0] - counts[1]) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--number", type=int, default=0, help="requests to count (0: none)")
    parser.add_argument("--flows", type=int, default=100)
    parser.add_argument("--render-logs", action="store_true",
                        help="render the run's log messages as FastMCP's client does")
    parser.add_argument("--grants", choices=GRANTS, default="none",
                        help="step grants: none, a yes-hook, an authenticator alone, or "
                        "declared grants its caller holds")
    parser.add_argument("--non-blocking", action="store_true",
                        help="call: the flow's tools declared blocking=False")
    parser.add_argument("--feature", choices=FEATURES, default="none",
                        help="the server's run history, metrics SDK or tracer on")
    parser.add_argument("--callgrind", action="store_true",
                        help="count under valgrind (--number and none); print per request")
    args = parser.parse_args()
    if args.callgrind:
        argv = [args.kind, "--flows", str(args.flows)]
        argv += ["--render-logs"] if args.render_logs else []
        argv += ["--non-blocking"] if args.non_blocking else []
        argv += ["--feature", args.feature, "--grants", args.grants]
        per = callgrind(argv, args.number or 200)
        print(f"{args.kind}: {per:,.0f} instructions per request")
        return
    logging.getLogger("chainweaver").setLevel(logging.ERROR)
    if args.kind in ("run", "hand"):
        run_locally(args.kind, args.number)
    else:
        asyncio.run(serve(args.kind, args.number, args.flows, args.render_logs,
                          args.non_blocking, args.feature, args.grants))


if __name__ == "__main__":
    main()
