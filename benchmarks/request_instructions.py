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
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from itertools import cycle

from bench_server import ARGUMENTS, PROMPT_ARGUMENTS, build_executor
from fastmcp import Client

from chainweaver.mcp import FlowServer


async def run(kind: str, number: int, flows: int) -> None:
    server = FlowServer(build_executor(flows), expose_schemas=True, expose_prompts=True)
    async with Client(server.fastmcp) as client:
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
    args = parser.parse_args()
    asyncio.run(run(args.kind, args.number, args.flows))


if __name__ == "__main__":
    main()
