"""Requests made after warm-up with the garbage collector frozen and off, for counting
instructions per request under valgrind, where wall-clock time is too noisy to tell a
difference of a few per cent.

One process makes ``--number`` requests of one kind (``read``, ``get`` or ``call``) on
``bench_server.py``'s catalogue; the instructions of a run with none, subtracted from
one with some, divided by their number, are one request's. Compare two copies of the
package by ``PYTHONPATH`` (``git archive REF chainweaver | tar -x -C DIR``)::

    PYTHONHASHSEED=0 PYTHONPATH=DIR valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/request_instructions.py read --number 400

and read valgrind's ``I refs`` line. See benchmarks/README.md ("one middleware layer").

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
from itertools import cycle

from bench_server import ARGUMENTS, PROMPT_ARGUMENTS, build_executor
from fastmcp import Client

from chainweaver.mcp import CallerIdentity, FlowServer, SecurityConfig

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


async def ignore(message: object) -> None:
    """A client log handler that drops the message (the server still sends it)."""


async def run(kind: str, number: int, flows: int, render_logs: bool = False,
              grants: str = "none") -> None:
    executor = build_executor(flows)
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        security=security(grants, executor))
    async with Client(server.fastmcp, log_handler=None if render_logs else ignore) as client:
        uris = cycle([str(r.uri) for r in await client.list_resources()]).__next__
        names = cycle([p.name for p in await client.list_prompts() if p.arguments]).__next__
        for _ in range(flows):  # every schema document serialised, every prompt built
            await client.read_resource(uris())
            await client.get_prompt(names(), PROMPT_ARGUMENTS)
        for _ in range(50):
            await client.call_tool("classify_0001", ARGUMENTS)
        gc.collect()
        gc.freeze()
        gc.disable()  # a collection inside the count would decide it
        for _ in range(number):
            if kind == "call":
                await client.call_tool("classify_0001", ARGUMENTS)
            elif kind == "read":
                await client.read_resource(uris())
            else:
                await client.get_prompt(names(), PROMPT_ARGUMENTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["read", "get", "call"])
    parser.add_argument("--number", type=int, default=0, help="requests to count (0: none)")
    parser.add_argument("--flows", type=int, default=100)
    parser.add_argument("--render-logs", action="store_true",
                        help="render the run's log messages as FastMCP's client does")
    parser.add_argument("--grants", choices=GRANTS, default="none",
                        help="step grants: none, a yes-hook, an authenticator alone, or "
                        "declared grants its caller holds")
    args = parser.parse_args()
    asyncio.run(run(args.kind, args.number, args.flows, args.render_logs, args.grants))


if __name__ == "__main__":
    main()
