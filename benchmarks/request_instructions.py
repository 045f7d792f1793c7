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

from chainweaver.mcp import FlowServer


async def ignore(message: object) -> None:
    """A client log handler that drops the message (the server still sends it)."""


async def run(kind: str, number: int, flows: int, render_logs: bool = False) -> None:
    server = FlowServer(build_executor(flows), expose_schemas=True, expose_prompts=True)
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
    args = parser.parse_args()
    asyncio.run(run(args.kind, args.number, args.flows, args.render_logs))


if __name__ == "__main__":
    main()
