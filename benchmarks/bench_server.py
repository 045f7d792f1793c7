"""FlowServer overhead over MCP, each measurement next to a bare FastMCP baseline.

Sections: 1. construction over N flows (target <= 100 ms); 2. the first lists after
construction (components are built lazily); 3. ``tools/call`` of a 3-step flow vs a bare
function tool doing the same work (<= 1.3x); 4. ``resources/list`` / ``resources/read``
vs N static resources (<= 1.2x); 5. ``prompts/list`` / ``prompts/get`` vs N function
prompts (<= 1.2x). All in one run, over in-memory ``fastmcp.Client``; candidate and
baseline take turns in small chunks so noise hits both. See benchmarks/README.md.

Run: ``python benchmarks/bench_server.py [--flows N] [--repeats N] [--quick] [--profile]
[--sections 1,1b,2,3,4,5]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import gc
import logging
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from typing import Any, Literal

import mcp_types
from bench_common import ignore_log
from fastmcp import Client, Context, FastMCP
from fastmcp.prompts.base import Message
from fastmcp.prompts.function_prompt import FunctionPrompt
from fastmcp.resources import TextResource
from fastmcp.server.dependencies import CurrentContext
from fastmcp.tools.function_tool import FunctionTool
from pydantic import BaseModel, Field, create_model

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    Tool,
    ToolSafetyContract,
)
from chainweaver.mcp import FlowServer, ServingConfig

SAFE = ToolSafetyContract(SideEffectLevel.NONE, idempotent=True)
# Every section, in the order they run; --sections picks some of them.
SECTIONS = ("1", "1b", "2", "3", "4", "5")
Mode = Literal["lower", "upper"]


class Request(BaseModel):
    text: str = Field(description="The text to classify", examples=["The quick brown fox"])
    max_words: int = Field(50, ge=1, le=1000, description="Word count that counts as long")
    mode: Mode = Field("lower", description="Case to normalise to")


class Cleaned(BaseModel):
    cleaned: str = Field(description="The normalised text")


class Counted(BaseModel):
    words: int = Field(description="Number of words")


class LabelInput(BaseModel):
    words: int
    max_words: int


class Labelled(BaseModel):
    label: Literal["short", "long"] = Field(description="Length class")
    words: int = Field(description="Number of words")


def clean(data: Request) -> Cleaned:
    text = data.text.strip()
    return Cleaned(cleaned=text.lower() if data.mode == "lower" else text.upper())


def count(data: Cleaned) -> dict[str, Any]:
    return {"words": len(data.cleaned.split())}


def label(data: LabelInput) -> dict[str, Any]:
    return {"label": "long" if data.words > data.max_words else "short", "words": data.words}


TOOLS = [
    Tool("clean", "Normalise text.", Request, Cleaned, clean, SAFE),
    Tool("count", "Count words.", Cleaned, Counted, count, SAFE),
    Tool("label", "Label by length.", LabelInput, Labelled, label, SAFE),
]
STEPS = [FlowStep("clean"), FlowStep("count"), FlowStep("label")]
ARGUMENTS = {"text": "  The quick brown fox  ", "mode": "lower"}
PROMPT_ARGUMENTS = {"text": "The quick brown fox"}


def build_executor(flows: int, *, blocking: bool = True) -> FlowExecutor:
    """N flows over the three tools (``blocking=False``: declared non-blocking, so a
    run calls them on the event loop)."""
    executor = FlowExecutor(FlowRegistry())
    for t in TOOLS if blocking else non_blocking(TOOLS):
        executor.register_tool(t)
    for i in range(flows):
        executor.registry.register_flow(Flow(
            f"classify_{i:04d}", f"Clean, count and label a text (variant {i}).", STEPS,
        ))
    return executor


def non_blocking(tools: list[Tool]) -> list[Tool]:
    """The same tools declared ``blocking=False``."""
    return [Tool(t.name, t.description, t.input_schema, t.output_schema, t.fn, t.safety,
                 blocking=False) for t in tools]


def bare_classify(text: str, max_words: int = 50, mode: Mode = "lower") -> Labelled:
    """Baseline tool: the same three validate-call-validate steps, written by hand."""
    context: dict[str, Any] = {"text": text, "max_words": max_words, "mode": mode}
    model: BaseModel | None = None
    for t in TOOLS:
        assert t.output_schema is not None
        model = t.output_schema.model_validate(
            t.fn(t.input_schema.model_validate(context)), from_attributes=True)
        context.update(model.model_dump())
    assert isinstance(model, Labelled)
    return model


async def _log(ctx: Context, message: str) -> None:
    """An info log message on the request's stream, as a run sends it."""
    await ctx.session.send_notification(mcp_types.LoggingMessageNotification(
        params=mcp_types.LoggingMessageNotificationParams(
            level="info", logger="chainweaver", data={"msg": message, "extra": None})),
        related_request_id=ctx.request_id)


def bare_notifying_server(name: str = "classify_0000") -> FastMCP:
    """A bare async FastMCP tool doing the flow's three validate-call-validate steps
    inline and sending what a run sends: a log message as each step starts and ends,
    and a progress notification as it ends."""
    server = FastMCP("bare-async")

    @server.tool(name=name)
    async def classify(text: str, max_words: int = 50, mode: Mode = "lower",
                       ctx: Context = CurrentContext()) -> Labelled:  # noqa: B008
        context: dict[str, Any] = {"text": text, "max_words": max_words, "mode": mode}
        model: Any = None
        for done, t in enumerate(TOOLS, 1):
            assert t.output_schema is not None
            await _log(ctx, f"step {t.name!r} started")
            model = t.output_schema.model_validate(
                t.fn(t.input_schema.model_validate(context)), from_attributes=True)
            context.update(model.model_dump())
            await _log(ctx, f"step {t.name!r} completed")
            await ctx.report_progress(done, len(TOOLS), f"step {t.name!r} completed")
        return model

    return server


# ------------------------------------------------------------------ timing


@dataclass
class Row:
    """Per-op timings (seconds) of one candidate, and of its baseline when it has one."""

    label: str
    candidate: list[float]
    baseline: list[float] | None = None
    target: float | None = None  # max ratio, or max seconds when there is no baseline
    # The stable statistic: the fastest single call of each side over every round.
    fastest: tuple[float, float] | None = None

    @property
    def ratio(self) -> float:
        assert self.baseline
        return min(self.candidate) / min(self.baseline)

    @property
    def median_ratio(self) -> float:
        assert self.baseline
        return statistics.median(self.candidate) / statistics.median(self.baseline)

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        value = self.ratio if self.baseline else min(self.candidate)
        return "PASS" if value <= self.target else "MISS"


def fmt(seconds: float) -> str:
    if seconds >= 0.1:
        return f"{seconds * 1e3:8.1f} ms"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds * 1e6:8.1f} us"


def report(row: Row) -> None:
    c = row.candidate
    line = f"  {row.label:<44} {fmt(min(c))} / {fmt(statistics.median(c))}"
    if row.baseline:
        b = row.baseline
        line += (f"   bare {fmt(min(b))} / {fmt(statistics.median(b))}"
                 f"   {row.ratio:5.2f}x (median {row.median_ratio:5.2f}x)")
        if row.target is not None:
            line += f"  target <= {row.target}x {row.verdict}"
        if row.fastest is not None:
            mine, bare = row.fastest
            line += (f"\n  {'':<44} per-call min {fmt(mine).strip()} vs "
                     f"{fmt(bare).strip()}: {mine / bare:5.2f}x")
    elif row.target is not None:
        line += f"   target <= {fmt(row.target).strip()} {row.verdict}"
    print(line, flush=True)


Op = Callable[[], Awaitable[Any]]


def settle() -> None:
    """Collect garbage and freeze what survives (servers, baselines, caches).

    Lists of 1,000 components make a lot of garbage; a full collection that lands
    inside one batch and not another would otherwise decide the ratio. Frozen
    objects are skipped by later collections, so those stay short and even.
    """
    gc.collect()
    gc.freeze()


async def timed(op: Op, number: int, fastest: list[float] | None = None,
                index: int = 0) -> float:
    """Total seconds for ``number`` sequential awaits of ``op``; with ``fastest``, each
    call is also timed on its own and ``fastest[index]`` keeps the quickest."""
    if fastest is None:
        started = time.perf_counter()
        for _ in range(number):
            await op()
        return time.perf_counter() - started
    total = 0.0
    for _ in range(number):
        started = time.perf_counter()
        await op()
        took = time.perf_counter() - started
        total += took
        fastest[index] = min(fastest[index], took)
    return total


async def batch(op: Op, number: int) -> float:
    """Seconds per call over ``number`` sequential awaits, after a garbage collection."""
    gc.collect()
    return await timed(op, number) / number


async def compare(ops: list[Op], number: int, repeats: int, warmup: int,
                  chunk: int = 10, fastest: list[float] | None = None
                  ) -> list[list[float]]:
    """Per-op samples (seconds per call), one per repeat, for each op.

    Within a repeat the ops take turns in chunks of ``chunk`` calls, the order
    rotating every chunk, so each op's sample spans the same stretch of wall-clock
    time as the others' and a burst of noise from other processes hits all of them.
    ``fastest`` (one entry per op) gets each op's quickest single call over every
    round: the statistic least moved by other processes.
    """
    for op in ops:
        for _ in range(warmup):
            await op()
    settle()
    samples: list[list[float]] = [[] for _ in ops]
    for _ in range(repeats):
        gc.collect()
        totals = [0.0] * len(ops)
        done = 0
        turn = 0
        while done < number:
            size = min(chunk, number - done)
            order = list(range(len(ops)))
            for index in order[turn % len(ops):] + order[:turn % len(ops)]:
                totals[index] += await timed(ops[index], size, fastest, index)
            done += size
            turn += 1
        for index, total in enumerate(totals):
            samples[index].append(total / number)
    return samples


# ---------------------------------------------------------------- sections

CONFIGS: dict[str, dict[str, bool]] = {
    "tools only": {},
    "expose_schemas": {"expose_schemas": True},
    "expose_schemas + expose_prompts": {"expose_schemas": True, "expose_prompts": True},
}


def section(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


def bench_construction(executor: FlowExecutor, flows: int, repeats: int) -> list[Row]:
    section(f"1. Construct FlowServer over {flows} registered flows (best / median)")
    first = {name: _construct(executor, flags) for name, flags in CONFIGS.items()}
    samples: dict[str, list[float]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for repeat in range(max(repeats, 3)):
        for name in names[repeat % 3:] + names[:repeat % 3]:
            samples[name].append(_construct(executor, CONFIGS[name]))
    rows = [Row(f"{name}", samples[name], target=0.100) for name in names]
    for row in rows:
        report(row)
    print("  first construction in the process (includes one-off schema generation): "
          + ", ".join(f"{name} {fmt(t).strip()}" for name, t in first.items()))
    return rows


def distinct_models(flows: int, tag: int) -> list[tuple[type[BaseModel], type[BaseModel]]]:
    """Fresh input/output model classes per flow: nothing is in any schema cache yet."""
    return [(create_model(f"In{tag}_{i}", query=(str, Field(description="What to find")),
                          limit=(int, Field(5, ge=1, description="How many"))),
             create_model(f"Out{tag}_{i}", items=(list[str], Field(description="Found"))))
            for i in range(flows)]


def bench_distinct_construction(flows: int, repeats: int) -> list[Row]:
    """Construction when every flow has its own models, against bare FastMCP doing the
    same schema generation for as many function tools. Construction generates each
    exposed flow's JSON Schema (to exclude a flow whose schema cannot be generated), so
    here it carries the one-off pydantic cost that FastMCP pays when it adds a tool."""
    section(f"1b. Construct over {flows} flows with distinct models, vs bare FastMCP "
            f"built with {flows} function tools over the same kind of models")
    candidate: list[float] = []
    baseline: list[float] = []
    for repeat in range(max(2, repeats // 2)):
        models = distinct_models(flows, 2 * repeat)
        executor = FlowExecutor(FlowRegistry())
        for i, (model_in, model_out) in enumerate(models):
            executor.register_tool(Tool(f"t{i}", "Find things.", model_in, model_out,
                                        lambda data: {"items": []}, safety=SAFE))
            executor.registry.register_flow(Flow(f"f{i}", "Find things.", [FlowStep(f"t{i}")]))
        candidate.append(_construct(executor, CONFIGS[next(iter(CONFIGS))]))
        functions = [_bare_function(model_in, model_out)
                     for model_in, model_out in distinct_models(flows, 2 * repeat + 1)]
        gc.collect()
        started = time.perf_counter()
        FastMCP("bare", tools=[FunctionTool.from_function(fn, name=f"f{i}")
                               for i, fn in enumerate(functions)])
        baseline.append(time.perf_counter() - started)
    row = Row("construct, distinct models vs bare FastMCP", candidate, baseline)
    report(row)
    return [row]


def _bare_function(model_in: type[BaseModel], model_out: type[BaseModel]) -> Callable[..., Any]:
    def find(data: Any) -> Any:
        return model_out(items=[])
    # Real classes, not the strings postponed annotations would leave for FastMCP.
    find.__annotations__ = {"data": model_in, "return": model_out}
    return find


def _construct(executor: FlowExecutor, flags: dict[str, bool]) -> float:
    gc.collect()
    started = time.perf_counter()
    FlowServer(executor, **flags)
    return time.perf_counter() - started


@dataclass
class Baselines:
    """Bare FastMCP servers publishing the same components the candidate lists.

    ``many`` holds N tools, N + 1 resources and N + 1 prompts with the candidate's
    names, descriptions, schemas, annotations, metadata and resource text, so the
    wire payloads match and only the server machinery differs. ``one`` holds a
    single tool, resource and prompt: FastMCP's own registry finds a component by
    scanning every component it holds, so ``one`` shows the cost without that scan.
    """

    many: FastMCP
    one: FastMCP
    tool: str
    uri: str
    prompt: str


async def build_baselines(executor: FlowExecutor) -> Baselines:
    schemas = FlowServer(executor, expose_schemas=True).fastmcp
    both = FlowServer(executor, expose_schemas=True, expose_prompts=True).fastmcp
    many, one = FastMCP("bare"), FastMCP("bare-one")

    template = FunctionTool.from_function(bare_classify)
    for index, flow_tool in enumerate(await both.list_tools()):
        many.add_tool(copy_tool(template, flow_tool))
        if index == 0:
            one.add_tool(copy_tool(template, flow_tool))
            tool = flow_tool.name

    uris = []
    for resource in await schemas.list_resources():
        uri = str(resource.uri)
        text = (await schemas.read_resource(uri)).contents[0].content
        static = TextResource(uri=uri, name=resource.name, title=resource.title,
                              description=resource.description, mime_type=resource.mime_type,
                              annotations=resource.annotations, meta=resource.meta, text=text)
        many.add_resource(static)
        uris.append(uri)
    one.add_resource(await many.get_resource(uris[-1]))

    # The baseline prompt returns the text the flow's prompt renders, with the value
    # put in by plain substitution: the same output, none of the schema work.
    sentinel = "SENTINEL-7f3a"  # plain text: survives JSON quoting unchanged
    prompts = list(await both.list_prompts())
    first = next(p for p in prompts if p.arguments)
    rendered = await both.render_prompt(first.name, {"text": sentinel})
    bodies = [(m.role, m.content.text) for m in rendered.messages]
    for prompt in prompts:
        fn = _bare_prompt(bodies, sentinel) if prompt.arguments else _bare_guide(prompt.name)
        component = FunctionPrompt.from_function(
            fn, name=prompt.name, title=prompt.title, description=prompt.description,
            meta=prompt.meta)
        if prompt.arguments:
            component = component.model_copy(update={"arguments": list(prompt.arguments)})
        many.add_prompt(component)
        if prompt is first:
            one.add_prompt(component)
    return Baselines(many, one, tool, uris[-1], first.name)


def copy_tool(template: FunctionTool, flow_tool: Any) -> FunctionTool:
    return template.model_copy(update={
        field: getattr(flow_tool, field) for field in
        ("name", "title", "description", "parameters", "output_schema", "annotations", "meta")
    })


def _bare_prompt(bodies: list[tuple[str, str]], sentinel: str) -> Callable[..., Any]:
    async def render(text: str, max_words: str = "", mode: str = "") -> list[Message]:
        return [Message(body.replace(sentinel, text), role=role)  # type: ignore[arg-type]
                for role, body in bodies]
    return render


def _bare_guide(name: str) -> Callable[[], Any]:
    async def guide() -> str:
        return f"The guide prompt {name}."
    return guide


async def bench_first_lists(executor: FlowExecutor, flows: int, repeats: int,
                            base: Client) -> list[Row]:
    section(f"2. Lists right after construction, {flows} flows, both flags "
            "(components are built on first use)")
    kinds = ("tools/list", "resources/list", "prompts/list")
    build: dict[str, list[float]] = {k: [] for k in kinds}
    total: list[float] = []
    first: dict[str, list[float]] = {k: [] for k in kinds}
    warm: dict[str, list[float]] = {k: [] for k in kinds}
    bare: dict[str, list[float]] = {k: [] for k in kinds}
    bare_ops = {"tools/list": base.list_tools, "resources/list": base.list_resources,
                "prompts/list": base.list_prompts}
    for _ in range(max(repeats, 3)):
        # Server side, no transport: the first list minus a warm one is what
        # building the components costs.
        settle()
        started = time.perf_counter()
        local = FlowServer(executor, expose_schemas=True, expose_prompts=True).fastmcp
        spent = time.perf_counter() - started
        lists = {"tools/list": local.list_tools, "resources/list": local.list_resources,
                 "prompts/list": local.list_prompts}
        for kind in kinds:
            cold = await batch(lists[kind], 1)
            spent += cold
            build[kind].append(cold - await batch(lists[kind], 1))
        total.append(spent)

        # Over the in-memory client, next to the same list on bare FastMCP.
        server = FlowServer(executor, expose_schemas=True, expose_prompts=True)
        async with Client(server.fastmcp) as client:
            ops = {"tools/list": client.list_tools, "resources/list": client.list_resources,
                   "prompts/list": client.list_prompts}
            settle()
            for kind in kinds:
                first[kind].append(await batch(ops[kind], 1))
                bare[kind].append(await batch(bare_ops[kind], 1))
                warm[kind].append(await batch(ops[kind], 1))
    rows = [Row(f"build {kind} components (server side)", build[kind]) for kind in kinds]
    rows.append(Row("construct + first list of each (server side)", total))
    for kind in kinds:
        rows.append(Row(f"first {kind} round trip vs bare", first[kind], bare[kind]))
        rows.append(Row(f"  then {kind} (warm) vs bare", warm[kind], bare[kind]))
    for row in rows:
        report(row)
    return rows



async def bench_call(flows: int, number: int, repeats: int, base: Client,
                     tool: str) -> list[Row]:
    section("3. tools/call round trip, 3-step flow vs bare FastMCP tool (same work)")
    # Bare FastMCP sends no notification during a call, so for the same work the flow
    # servers send none either: FastMCP's client asks for progress and every log level on
    # each call, which a run answers with a progress and two log notifications per step.
    # The last rows compare runs that send them with a bare async tool that sends the
    # same ones (bare_notifying_server), with the default thread hop and without it.
    quiet = ServingConfig(run_notifications=False)
    small = FlowServer(build_executor(1), serving=quiet)
    large = FlowServer(build_executor(flows), serving=quiet)
    loud = FlowServer(build_executor(1))
    try:
        loud_inline: FlowServer | None = FlowServer(build_executor(1, blocking=False))
    except TypeError:  # a chainweaver from before Tool(blocking=...) (bench_before_after)
        loud_inline = None
    # Printing log messages (the client's default handler renders each with rich) is the
    # client's work, not the server's: dropped.
    async with AsyncExitStack() as stack:
        targets = [small.fastmcp, large.fastmcp, loud.fastmcp, bare_notifying_server()]
        if loud_inline is not None:
            targets.append(loud_inline.fastmcp)
        clients = [await stack.enter_async_context(Client(target, log_handler=ignore_log))
                   for target in targets]
        results = [await c.call_tool(tool, ARGUMENTS) for c in (*clients, base)]
        for result in results[:-1]:
            assert result.structured_content == results[-1].structured_content, results
        ops = [functools.partial(c.call_tool, tool, ARGUMENTS) for c in (*clients, base)]
        fastest = [float("inf")] * len(ops)
        samples = await compare(ops, number, repeats, warmup=max(number // 4, 5),
                                fastest=fastest)
    rows = [Row("FlowServer, 1 flow vs bare, 1 tool", samples[0], samples[-1], target=1.3,
                fastest=(fastest[0], fastest[-1])),
            Row(f"FlowServer, {flows} flows vs bare, 1 tool", samples[1], samples[-1],
                target=1.3, fastest=(fastest[1], fastest[-1])),
            Row("notifications on vs bare async, same ones", samples[2], samples[3],
                target=1.2, fastest=(fastest[2], fastest[3]))]
    if loud_inline is not None:
        rows.append(Row("  the same, tools blocking=False", samples[4], samples[3],
                        target=1.0, fastest=(fastest[4], fastest[3])))
    for row in rows:
        report(row)
    return rows


def count_instructions() -> list[Row]:
    """Instructions per call (request_instructions.py under valgrind): the flow server
    with notifications on, with and without the thread hop, and the bare async tool."""
    section("3b. tools/call instructions per call (valgrind), vs the bare async tool")
    if shutil.which("valgrind") is None:
        print("  skipped: valgrind is not installed")
        return []
    script = Path(__file__).with_name("request_instructions.py")
    counts = {}
    for label, extra in (("bare", ["bare-call"]), ("flow", ["call"]),
                         ("flow, blocking=False", ["call", "--non-blocking"])):
        done = subprocess.run([sys.executable, str(script), *extra, "--number", "100",
                               "--callgrind"], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"  {label}: failed: {done.stderr.strip()[-300:]}")
            return []
        counts[label] = float(done.stdout.split(":")[1].split()[0].replace(",", ""))
    for label in ("flow", "flow, blocking=False"):
        print(f"  {label:<22} {counts[label]:>12,.0f} vs bare {counts['bare']:>12,.0f}"
              f"   {counts[label] / counts['bare']:5.3f}x  target <= 1.05x "
              f"{'PASS' if counts[label] / counts['bare'] <= 1.05 else 'MISS'}")
    return []


async def bench_resources(executor: FlowExecutor, flows: int, list_number: int,
                          read_number: int, repeats: int, base: Client, one: Client,
                          one_uri: str) -> list[Row]:
    section(f"4. Schema resources, {flows} flows, expose_schemas=True vs "
            f"bare FastMCP with {flows + 1} static resources")
    server = FlowServer(executor, expose_schemas=True)
    async with Client(server.fastmcp) as client:
        uris = [str(r.uri) for r in await client.list_resources()]
        assert uris == [str(r.uri) for r in await base.list_resources()]
        for uri in uris[:3] + uris[-3:]:
            assert (await client.read_resource(uri))[0].text == \
                (await base.read_resource(uri))[0].text
        # Each schema document is serialised on its first read: time one pass over
        # every URI on a fresh server, so the measured reads below are all warm.
        settle()
        mine, theirs = cycle(uris).__next__, cycle(uris).__next__
        cold = [await batch(lambda: client.read_resource(mine()), len(uris))]
        cold_bare = [await batch(lambda: base.read_resource(theirs()), len(uris))]
        lists = await compare([client.list_resources, base.list_resources],
                              list_number, repeats, warmup=2, chunk=1)
        reads = await compare([lambda: client.read_resource(mine()),
                               lambda: base.read_resource(theirs()),
                               lambda: one.read_resource(one_uri)],
                              read_number, repeats, warmup=max(read_number // 4, 5))
    rows = [Row("first resources/read of each URI", cold, cold_bare),
            Row("resources/list", *lists, target=1.2),
            Row("resources/read", reads[0], reads[1], target=1.2),
            Row("  resources/read vs bare with 1 resource", reads[0], reads[2])]
    for row in rows:
        report(row)
    return rows


async def bench_prompts(executor: FlowExecutor, flows: int, list_number: int,
                        get_number: int, repeats: int, base: Client, one: Client,
                        one_name: str) -> list[Row]:
    section(f"5. Prompts, {flows} flows, both flags vs bare FastMCP with "
            f"{flows + 1} function prompts")
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True)
    async with Client(server.fastmcp) as client:
        listed = await client.list_prompts()
        # Same prompts (the owner mark in _meta is per FlowServer instance).
        assert [p.model_dump(exclude={"meta"}) for p in listed] == \
            [p.model_dump(exclude={"meta"}) for p in await base.list_prompts()]
        names = [p.name for p in listed if p.arguments]
        mine_text = (await client.get_prompt(names[0], PROMPT_ARGUMENTS)).messages
        their_text = (await base.get_prompt(names[0], PROMPT_ARGUMENTS)).messages
        assert [m.content.text for m in mine_text] == [m.content.text for m in their_text]
        mine, theirs = cycle(names).__next__, cycle(names).__next__
        lists = await compare([client.list_prompts, base.list_prompts],
                              list_number, repeats, warmup=2, chunk=1)
        gets = await compare([lambda: client.get_prompt(mine(), PROMPT_ARGUMENTS),
                              lambda: base.get_prompt(theirs(), PROMPT_ARGUMENTS),
                              lambda: one.get_prompt(one_name, PROMPT_ARGUMENTS)],
                             get_number, repeats, warmup=max(get_number // 4, 5))
    rows = [Row("prompts/list", *lists, target=1.2),
            Row("prompts/get", gets[0], gets[1], target=1.2),
            Row("  prompts/get vs bare with 1 prompt", gets[0], gets[2])]
    for row in rows:
        report(row)
    return rows


# -------------------------------------------------------------------- main


async def run_async(args: argparse.Namespace, executor: FlowExecutor,
                    sections: frozenset[str] = frozenset(SECTIONS)) -> list[Row]:
    """Sections 2 to 5 (those of ``sections``), over clients of the bare baselines."""
    started = time.perf_counter()
    baselines = await build_baselines(executor)
    print(f"\n(bare FastMCP baselines built in {time.perf_counter() - started:.1f} s)",
          flush=True)
    rows: list[Row] = []
    async with Client(baselines.many) as many, Client(baselines.one) as one:
        if "2" in sections:
            rows += await bench_first_lists(executor, args.flows, args.repeats, many)
        if "3" in sections:
            rows += await bench_call(args.flows, args.number, args.repeats, one,
                                     baselines.tool)
            if args.instructions:
                rows += count_instructions()
        if "4" in sections:
            rows += await bench_resources(executor, args.flows, args.list_number,
                                          args.number, args.repeats, many, one,
                                          baselines.uri)
        if "5" in sections:
            rows += await bench_prompts(executor, args.flows, args.list_number, args.number,
                                        args.repeats, many, one, baselines.prompt)
    return rows


def parse_sections(text: str) -> frozenset[str]:
    """The sections ``--sections`` names (comma-separated, of ``SECTIONS``)."""
    chosen = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(chosen - set(SECTIONS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"sections are {', '.join(SECTIONS)}; got {text!r}")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--flows", type=int, default=1000, help="registered flows (1000)")
    parser.add_argument("--repeats", type=int, default=7, help="batches per op (7)")
    parser.add_argument("--number", type=int, default=200,
                        help="calls per batch for call/read/get (200)")
    parser.add_argument("--list-number", type=int, default=3,
                        help="calls per batch for list requests (3)")
    parser.add_argument("--quick", action="store_true",
                        help="a few seconds: 100 flows, 3 repeats, small batches")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the whole run; print the top functions")
    parser.add_argument("--instructions", action="store_true",
                        help="section 3: also count instructions per call under valgrind")
    parser.add_argument("--sections", type=parse_sections, default=frozenset(SECTIONS),
                        help="comma-separated sections to run, of 1,1b,2,3,4,5 (all)")
    args = parser.parse_args()
    if args.quick:
        args.flows, args.repeats, args.number, args.list_number = 100, 3, 20, 1
    logging.getLogger("chainweaver").setLevel(logging.ERROR)

    print(f"FlowServer benchmark: {args.flows} flows, {args.repeats} repeats, "
          f"{args.number} calls per batch ({args.list_number} for lists); "
          "times per op, best / median; ratios best/best (median/median)", flush=True)
    executor = build_executor(args.flows)
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    rows: list[Row] = []
    if "1" in args.sections:
        rows += bench_construction(executor, args.flows, args.repeats)
    if "1b" in args.sections:
        rows += bench_distinct_construction(args.flows, args.repeats)
    if args.sections & {"2", "3", "4", "5"}:
        rows += asyncio.run(run_async(args, executor, args.sections))
    if profiler:
        profiler.disable()

    section("Summary")
    for row in rows:
        if row.target is not None:
            value = (f"{row.ratio:.2f}x (median {row.median_ratio:.2f}x)" if row.baseline
                     else f"{fmt(min(row.candidate)).strip()} "
                          f"(median {fmt(statistics.median(row.candidate)).strip()})")
            print(f"  {row.verdict}  {row.label:<44} {value}")
    if profiler:
        section("Profile (tottime)")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
