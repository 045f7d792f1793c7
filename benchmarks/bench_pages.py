"""What one list page costs as the catalogue grows, with ``ServingConfig(page_size=N)``.

For ``tools/list``, ``resources/list`` (``expose_schemas=True``) and ``prompts/list``
(``expose_prompts=True``), over an in-memory ``fastmcp.Client``, at each ``--sizes``
catalogue (bench_server.py's flows: a 3-step chain over three shared tools):

- **cold**: the first page on a fresh server over a new executor (every flow compiled
  and decided, the caller's list sorted once), over that executor again (plans
  cached), and once the catalogue was decided (``exposure_report()``): the sorted
  list and the page alone;
- **steady**: the first page and a page in the middle (reached once by following
  ``nextCursor``, then requested again with that cursor), many times. Every size and
  page take turns in chunks, the order rotating, so noise from other processes hits
  all of them. Target: largest / smallest size <= 1.5x.

For contrast, the same pages on bare FastMCP servers holding as many function
components with the same names and metadata and ``list_page_size``: FastMCP converts
every component before it slices the page. See benchmarks/README.md.

Run: ``python benchmarks/bench_pages.py [--sizes 1000,20000] [--page-size N] [--rounds N]
[--chunk N] [--cold-rounds N] [--kinds tools,resources,prompts] [--quick] [--profile]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import logging
import pstats
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from bench_common import machine_line
from bench_server import (
    _bare_guide,
    _bare_prompt,
    bare_classify,
    build_executor,
    copy_tool,
    fmt,
    settle,
)
from fastmcp import Client, FastMCP
from fastmcp.prompts.function_prompt import FunctionPrompt
from fastmcp.resources import TextResource
from fastmcp.tools.function_tool import FunctionTool
from fastmcp.utilities.components import FastMCPComponent
from fastmcp.utilities.pagination import CursorState

from chainweaver import FlowExecutor
from chainweaver.mcp import FlowServer, ServingConfig

TARGET = 1.5  # steady page, largest size / smallest size


@dataclass(frozen=True)
class Kind:
    """One list primitive: its method, the flags that publish it, and how to read it."""

    method: str
    flags: dict[str, bool]
    items: str  # the result's field holding the page

    def fetch(self, client: Client, cursor: str | None = None) -> Awaitable[Any]:
        """One list request (never answered from the client's response cache)."""
        send = {"tools/list": client.list_tools_mcp,
                "resources/list": client.list_resources_mcp,
                "prompts/list": client.list_prompts_mcp}[self.method]
        return send(cursor=cursor, cache_mode="bypass")

    def names(self, result: Any) -> list[str]:
        """The names (URIs for resources) of a page, in order."""
        return [str(item.uri) if self.items == "resources" else item.name
                for item in getattr(result, self.items)]


KINDS = {
    "tools": Kind("tools/list", {}, "tools"),
    "resources": Kind("resources/list", {"expose_schemas": True}, "resources"),
    "prompts": Kind("prompts/list", {"expose_prompts": True}, "prompts"),
}


class CheckFailed(Exception):
    """A page was not what it should be (the benchmark exits 1)."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


# ----------------------------------------------------------------- servers


def flow_server(executor: FlowExecutor, kind: Kind, page_size: int) -> FlowServer:
    return FlowServer(executor, **kind.flags, serving=ServingConfig(page_size=page_size))


async def bare_server(executor: FlowExecutor, kind: Kind, page_size: int) -> FastMCP:
    """Bare FastMCP with one function component per item the flow server lists (same
    names, titles, descriptions, schemas, arguments, annotations and ``_meta``), in
    the same order, paging with ``list_page_size``."""
    source = FlowServer(executor, **kind.flags).fastmcp  # unpaged, server side
    bare = FastMCP("bare", list_page_size=page_size)
    components: list[FastMCPComponent] = []
    if kind.method == "tools/list":
        template = FunctionTool.from_function(bare_classify)
        components = [copy_tool(template, tool) for tool in await source.list_tools()]
        add: Callable[[Any], Any] = bare.add_tool
    elif kind.method == "resources/list":
        # A list carries no text: the documents themselves are not needed.
        components = [TextResource(
            uri=str(resource.uri), name=resource.name, title=resource.title,
            description=resource.description, mime_type=resource.mime_type,
            annotations=resource.annotations, meta=resource.meta, text="{}")
            for resource in await source.list_resources()]
        add = bare.add_resource
    else:
        sentinel = "SENTINEL"
        with_arguments = FunctionPrompt.from_function(_bare_prompt([("user", sentinel)],
                                                                   sentinel), name="p")
        guide = FunctionPrompt.from_function(_bare_guide("guide"), name="g")
        for prompt in await source.list_prompts():
            update: dict[str, Any] = {"name": prompt.name, "title": prompt.title,
                                      "description": prompt.description, "meta": prompt.meta}
            if prompt.arguments:
                update["arguments"] = list(prompt.arguments)
            components.append((with_arguments if prompt.arguments else guide)
                              .model_copy(update=update))
        add = bare.add_prompt
    # FastMCP's add_* scans every component the server already holds (LocalProvider.
    # _check_version_mixing): 20,000 adds take minutes. The first goes through it, the
    # rest straight into the same storage, which is all a list reads.
    add(components[0])
    storage = bare.local_provider._components
    for component in components[1:]:
        assert component.key not in storage, component.key
        storage[component.key] = component
    return bare


# ------------------------------------------------------------------ timing


@dataclass
class Lane:
    """One page request to time over and over: a client, a kind, a cursor."""

    label: str
    client: Client
    kind: Kind
    cursor: str | None
    chunk: int
    samples: list[float] = field(default_factory=list)

    async def once(self) -> Any:
        return await self.kind.fetch(self.client, self.cursor)

    async def timed(self, calls: int) -> None:
        for _ in range(calls):
            started = time.perf_counter()
            await self.kind.fetch(self.client, self.cursor)
            self.samples.append(time.perf_counter() - started)


async def alternate(lanes: list[Lane], rounds: int, warmup: int) -> None:
    """``rounds`` rounds; in each, every lane makes ``lane.chunk`` timed requests, the
    lanes' order rotating every round, so each lane's samples span the same stretch of
    wall-clock time and a burst of noise from other processes hits all of them."""
    for lane in lanes:
        for _ in range(warmup):
            await lane.once()
    settle()
    for turn in range(rounds):
        gc.collect()
        shift = turn % len(lanes)
        for lane in lanes[shift:] + lanes[:shift]:
            await lane.timed(lane.chunk)


def best_median(samples: list[float]) -> str:
    return f"{fmt(min(samples)).strip()} / {fmt(statistics.median(samples)).strip()}"


def ratio(large: list[float], small: list[float]) -> tuple[float, float]:
    """largest / smallest size: best / best and median / median."""
    return (min(large) / min(small),
            statistics.median(large) / statistics.median(small))


@dataclass
class Verdict:
    """A steady-state page's ratio between the largest and smallest size."""

    label: str
    best: float
    median: float

    @property
    def passed(self) -> bool:
        return self.best <= TARGET


# ---------------------------------------------------------------- sections


def middle_index(size: int, page_size: int) -> int:
    """How many pages in the middle page is (its offset is this times the page size)."""
    return max(1, size // 2 // page_size)


COLD_ROWS = ("cold first page, new executor", "cold first page, warm executor",
             "cold first page, catalogue decided")


async def bench_cold(kind: Kind, sizes: list[int], page_size: int, rounds: int) -> None:
    """First page on fresh servers, sizes taking turns: over a new executor (every flow
    compiled and decided), over that executor again (plans cached: every flow decided),
    and once ``exposure_report()`` decided every flow (the sorted list and the page)."""
    table: dict[str, dict[int, list[float]]] = {row: {size: [] for size in sizes}
                                                for row in COLD_ROWS}
    for turn in range(rounds):
        shift = turn % len(sizes)
        for size in sizes[shift:] + sizes[:shift]:
            executor = build_executor(size)
            for row in COLD_ROWS:
                server = flow_server(executor, kind, page_size)
                if row == COLD_ROWS[2]:
                    server.exposure_report()  # decides every flow
                async with Client(server.fastmcp) as client:
                    gc.collect()
                    started = time.perf_counter()
                    first = await kind.fetch(client)
                    table[row][size].append(time.perf_counter() - started)
                check(len(kind.names(first)) == page_size and first.next_cursor is not None,
                      f"cold {kind.method} at {size}: not a full first page")
    small, large = sizes[0], sizes[-1]
    for label in COLD_ROWS:
        cells = "   ".join(f"{size:,}: {best_median(table[label][size])}" for size in sizes)
        best, median = ratio(table[label][large], table[label][small])
        print(f"  {label:<38} {cells}   {large:,}/{small:,} {best:.2f}x "
              f"(median {median:.2f}x)", flush=True)


async def bench_steady(kind: Kind, executors: dict[int, FlowExecutor], page_size: int,
                       rounds: int, chunk: int, warmup: int, bare_rounds: int,
                       profile: bool) -> list[Verdict]:
    """Steady-state first and middle pages at every size, and on bare FastMCP."""
    sizes = list(executors)
    servers = {size: flow_server(executors[size], kind, page_size) for size in sizes}
    bares = {size: await bare_server(executors[size], kind, page_size) for size in sizes}
    lanes: list[Lane] = []
    bare_lanes: list[Lane] = []
    async with AsyncExitStack() as stack:  # every connection lives for the whole run
        for size in sizes:
            client = await stack.enter_async_context(Client(servers[size].fastmcp))
            bare_client = await stack.enter_async_context(Client(bares[size]))
            first = await kind.fetch(client)
            cursor = first.next_cursor
            for _ in range(middle_index(size, page_size) - 1):
                cursor = (await kind.fetch(client, cursor)).next_cursor
                check(cursor is not None, f"{kind.method} at {size}: list ended early")
            middle = await kind.fetch(client, cursor)
            offset = middle_index(size, page_size) * page_size
            # FastMCP's own cursor for that offset (its format is an offset in JSON).
            bare_cursor = CursorState(offset=offset).encode()
            # The same pages bare FastMCP serves from the same components.
            check(kind.names(first) == kind.names(await kind.fetch(bare_client)),
                  f"{kind.method} at {size}: first page differs from bare FastMCP's")
            check(kind.names(middle) == kind.names(await kind.fetch(bare_client, bare_cursor)),
                  f"{kind.method} at {size}: middle page differs from bare FastMCP's")
            check(len(kind.names(middle)) == page_size,
                  f"{kind.method} at {size}: middle page not full")
            lanes += [Lane(f"{size:,} first", client, kind, None, chunk),
                      Lane(f"{size:,} middle", client, kind, cursor, chunk)]
            bare_lanes += [Lane(f"{size:,} first", bare_client, kind, None, 1),
                           Lane(f"{size:,} middle", bare_client, kind, bare_cursor, 1)]
            print(f"  ({size:,} flows: middle page at offset {offset:,}, first item "
                  f"{kind.names(middle)[0]})", flush=True)
        await alternate(lanes, rounds, warmup)
        await alternate(bare_lanes, bare_rounds, 1)
        if profile:
            await _profile(lanes[-1], rounds * chunk)

    verdicts: list[Verdict] = []
    small, large = sizes[0], sizes[-1]
    for name, group in (("FlowServer", lanes), ("bare FastMCP", bare_lanes)):
        for page in ("first", "middle"):
            by_size = {size: next(lane for lane in group
                                  if lane.label == f"{size:,} {page}").samples
                       for size in sizes}
            cells = "   ".join(f"{size:,}: {best_median(by_size[size])}" for size in sizes)
            best, median = ratio(by_size[large], by_size[small])
            line = (f"  {name + ', ' + page + ' page':<38} {cells}   {large:,}/{small:,} "
                    f"{best:.2f}x (median {median:.2f}x)")
            if name == "FlowServer":
                verdict = Verdict(f"{kind.method} {page} page", best, median)
                verdicts.append(verdict)
                line += f"  target <= {TARGET}x {'PASS' if verdict.passed else 'MISS'}"
            print(line + f"  [{len(by_size[small])} calls each]", flush=True)
    return verdicts


async def _profile(lane: Lane, calls: int) -> None:
    """cProfile of ``calls`` requests of one lane (the largest size's middle page)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        await lane.once()
    profiler.disable()
    print(f"\n  -- profile: {calls} x {lane.kind.method}, {lane.label} page (tottime)")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(20)


# -------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> list[Verdict]:
    started = time.perf_counter()
    executors = {size: build_executor(size) for size in args.sizes}
    # The first construction in the process generates the shared schemas: not counted.
    warm = FlowServer(build_executor(2), expose_schemas=True, expose_prompts=True,
                      serving=ServingConfig(page_size=args.page_size))
    async with Client(warm.fastmcp) as client:
        for kind in KINDS.values():
            await kind.fetch(client)
    print(f"(registries built in {time.perf_counter() - started:.1f} s)", flush=True)
    verdicts: list[Verdict] = []
    for name in args.kinds:
        kind = KINDS[name]
        flags = ", ".join(f"{flag}=True" for flag in kind.flags)
        print(f"\n== {kind.method}{', ' + flags if flags else ''}, page_size="
              f"{args.page_size}; best / median per request ==", flush=True)
        await bench_cold(kind, args.sizes, args.page_size, args.cold_rounds)
        verdicts += await bench_steady(kind, executors, args.page_size, args.rounds,
                                       args.chunk, args.warmup, args.bare_rounds,
                                       args.profile)
        gc.unfreeze()
        gc.collect()
    return verdicts


def parse_sizes(text: str) -> list[int]:
    sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    if len(sizes) < 2 or sizes[0] < 1:
        raise argparse.ArgumentTypeError("give at least two positive sizes, e.g. 1000,20000")
    return sizes


def parse_kinds(text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    if not kinds or set(kinds) - set(KINDS):
        raise argparse.ArgumentTypeError(f"kinds are {', '.join(KINDS)}; got {text!r}")
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[1000, 20000],
                        help="catalogue sizes, comma-separated (1000,20000)")
    parser.add_argument("--page-size", type=int, default=100, help="ServingConfig page_size (100)")
    parser.add_argument("--kinds", type=parse_kinds, default=list(KINDS),
                        help="tools,resources,prompts (all)")
    parser.add_argument("--rounds", type=int, default=20,
                        help="steady-state rounds; each lane takes --chunk requests a round (20)")
    parser.add_argument("--chunk", type=int, default=10, help="requests per lane per round (10)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests per lane (5)")
    parser.add_argument("--bare-rounds", type=int, default=8,
                        help="rounds of one request per bare FastMCP page (8)")
    parser.add_argument("--cold-rounds", type=int, default=3,
                        help="fresh servers per size and row (3)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: sizes 200,2000, few rounds")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the largest size's middle page; print the top")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds, args.chunk, args.warmup = [200, 2000], 2, 3, 1
        args.bare_rounds, args.cold_rounds = 1, 1
    for size in args.sizes:
        if size < 2 * args.page_size:
            parser.error(f"size {size} is under two pages of {args.page_size}")
    logging.getLogger("chainweaver").setLevel(logging.ERROR)

    print(f"Page benchmark: sizes {', '.join(f'{s:,}' for s in args.sizes)}, page_size "
          f"{args.page_size}, {args.rounds} rounds x {args.chunk} requests per page "
          f"({args.bare_rounds} x 1 on bare FastMCP), {args.cold_rounds} cold rounds",
          flush=True)
    print(f"({machine_line()})", flush=True)
    try:
        verdicts = asyncio.run(run(args))
    except CheckFailed as failure:
        print(f"CHECK FAILED: {failure}", flush=True)
        sys.exit(1)

    print("\n== Summary: steady-state page, "
          f"{args.sizes[-1]:,} / {args.sizes[0]:,} flows ==")
    for verdict in verdicts:
        print(f"  {'PASS' if verdict.passed else 'MISS'}  {verdict.label:<28} "
              f"{verdict.best:.2f}x (median {verdict.median:.2f}x)  target <= {TARGET}x")


if __name__ == "__main__":
    main()
