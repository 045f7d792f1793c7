"""What one message carries, where the wire-limit tests (test_wire_limit.py) stop:
text measured as the most expansive transport sends it (2026-07-28 streamable HTTP
escapes every character outside ASCII), the output spill shared fairly between callers,
an output dropped from a store reading as not found, a run with hundreds of steps, and
the tool forms of reads and renders. Real in-memory clients on both eras."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import CallerIdentity, FlowServer, GateContext, SecurityConfig, ServingConfig
from chainweaver.mcp.components.provider import FlowProvider
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.body_cap import MAX_RANGE_BYTES, MESSAGE_BUDGET, WIRE_LIMIT
from chainweaver.mcp.runs.records import RunRecord
from chainweaver.mcp.runs.spill import SpillStore
from chainweaver.mcp.runs.step_names import STEPS_BUDGET

MODES = ["auto", "legacy"]


class Size(BaseModel):
    n: int
    ch: str = "x"


@tool(safety=ToolSafetyContract("read"))
def loose(size: Size) -> dict:
    return {"data": size.ch * size.n}


@tool(safety=ToolSafetyContract("read"))
def passed(size: Size) -> Size:
    return size


class Who:
    """The caller of the next requests, as the authenticator says."""

    def __init__(self) -> None:
        self.id = "alice"

    def __call__(self, gate: GateContext) -> CallerIdentity:
        return CallerIdentity(self.id, subject=self.id)


def server(history: RunHistory | None = None, steps: int = 0, **options: Any) -> FlowServer:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(loose)
    executor.register_tool(passed)
    registry.register_flow(Flow("untyped", "Untyped output.", [FlowStep("loose")]))
    if steps:
        long = [FlowStep("passed", id=f"a_step_with_a_long_descriptive_name_{index:04d}")
                for index in range(steps)]
        registry.register_flow(Flow("long", "Many steps.", [*long, FlowStep("loose")]))
    return FlowServer(executor, **options, run_history=history)


def spill_of(flows: FlowServer) -> SpillStore:
    (provider,) = [p for p in flows.fastmcp.providers if isinstance(p, FlowProvider)]
    assert provider.outputs is not None and isinstance(provider.outputs.store, SpillStore)
    return provider.outputs.store


def sent(result: Any) -> int:
    """The bytes a result takes as the 2026-07-28 HTTP transport sends it (the SDK's
    json.dumps: every character outside ASCII escaped), the most any transport takes."""
    return len(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True),
                          separators=(",", ":")))


async def read_back(client: Client, uri: str, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = await client.read_resource(f"{uri}?offset={len(data)}&length={MAX_RANGE_BYTES}")
        chunk = base64.b64decode(part[0].blob)
        assert 0 < len(chunk) <= MAX_RANGE_BYTES
        data += chunk
    return data


async def missing(client: Client, uri: str) -> str:
    with pytest.raises(MCPError) as caught:
        await client.read_resource(uri)
    assert caught.value.error.code == -32602
    return caught.value.error.message


# ----------------------------------------------------------- measured as sent


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("history", [None, RunHistory(output_limit=4 * 2**20)],
                         ids=["spill", "history"])
@pytest.mark.parametrize(("ch", "n"), [("中", 300_000), ("😀", 200_000)])
async def test_text_outside_ascii_is_measured_as_escaped_on_the_wire(
        mode: str, history: RunHistory | None, ch: str, n: int) -> None:
    # 900 KB and 800 KB of UTF-8, but 1.8 and 2.4 MB as the 2026-07-28 HTTP transport
    # sends them (\uXXXX, twice for a character beyond the BMP): a link, on every era.
    async with Client(server(history).fastmcp, mode=mode) as client:
        result = await client.session.call_tool("untyped", {"n": n, "ch": ch})
        assert sent(result) < WIRE_LIMIT
        output = result.meta["chainweaver"]["output"]
        assert result.content[1].type == "resource_link"
        data = await read_back(client, output["uri"], output["size"])
    assert json.loads(data) == {"data": ch * n}
    assert hashlib.sha256(data).hexdigest() == output["sha256"]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_run_with_hundreds_of_steps_says_how_many_instead_of_listing_them(
        mode: str) -> None:
    # 400 steps take about 60 KB of _meta: beside an output just within the budget, the
    # message would pass 1 MiB.
    async with Client(server(steps=400).fastmcp, mode=mode) as client:
        result = await client.session.call_tool("long", {"n": MESSAGE_BUDGET - 100})
        short = await client.session.call_tool("untyped", {"n": 10})
    assert not result.is_error and len(result.content) == 1  # the output itself
    assert sent(result) < WIRE_LIMIT
    assert result.meta["chainweaver"]["steps_omitted"] == 401
    assert "steps" not in result.meta["chainweaver"]
    assert len(json.dumps(short.meta["chainweaver"]["steps"])) < STEPS_BUDGET
    assert [step["id"] for step in short.meta["chainweaver"]["steps"]] == ["loose"]


# ------------------------------------------------------------------ the spill


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_one_callers_outputs_never_evict_another_callers_from_the_spill(
        mode: str) -> None:
    who = Who()
    flows = server(security=SecurityConfig(authenticator=who))
    spill = spill_of(flows)
    spill.max_output_bytes = 8 * 2**20  # room for four 2 MB outputs
    async with Client(flows.fastmcp, mode=mode) as client:
        kept = await client.session.call_tool("untyped", {"n": 2_000_000})
        alices = kept.meta["chainweaver"]["output"]
        who.id = "mallory"
        uris = []
        for _ in range(6):
            result = await client.session.call_tool("untyped", {"n": 2_000_000})
            assert result.content[1].type == "resource_link"
            uris.append(result.meta["chainweaver"]["output"]["uri"])
        # Mallory's own oldest went; its newest are there (read as bytes of the output).
        for uri in uris[:3]:
            assert await missing(client, f"{uri}?offset=0") == \
                f"Resource not found: '{uri}?offset=0'"
        for uri in uris[3:]:
            assert (await client.read_resource(f"{uri}?offset=0"))[0].blob
        # Alice's, held by the caller holding least, is whole.
        who.id = "alice"
        data = await read_back(client, alices["uri"], alices["size"])
    assert hashlib.sha256(data).hexdigest() == alices["sha256"]


@pytest.mark.anyio
async def test_an_output_that_would_be_the_one_to_give_up_is_an_error_not_a_dead_link(
) -> None:
    who = Who()
    flows = server(security=SecurityConfig(authenticator=who))
    spill_of(flows).max_output_bytes = 5 * 2**20
    async with Client(flows.fastmcp) as client:
        held = await client.session.call_tool("untyped", {"n": 2_000_000})
        who.id = "mallory"
        # Mallory would hold 4 MB, more than alice: its newcomer is what goes.
        result = await client.session.call_tool("untyped", {"n": 4_000_000})
        who.id = "alice"
        uri = held.meta["chainweaver"]["output"]["uri"]
        assert (await client.read_resource(f"{uri}?offset=0"))[0].blob
    assert result.is_error and len(result.content) == 1
    assert result.content[0].text == (
        f"The result of flow 'untyped' is 4000012 bytes, above the {MESSAGE_BUDGET} bytes "
        "one MCP message carries to a standard client; this server cannot keep it for "
        "reading in ranges.")
    assert "output" not in result.meta["chainweaver"]


def record(run_id: str, caller: str) -> RunRecord:
    return RunRecord(run_id, "flow", "1", "flow", caller, 0, 0.0)


@pytest.mark.anyio
async def test_the_spill_shares_its_count_and_forgets_outputs_past_their_age(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("chainweaver.mcp.runs.spill.time.monotonic", lambda: now[0])
    spill = SpillStore(max_runs=4, max_age=60.0, max_output_bytes=10**6)
    assert spill.keep(record("a1", "alice"), b"a")
    for index in range(6):
        now[0] += 1
        assert spill.keep(record(f"m{index}", "mallory"), b"m")
    assert await spill.output("a1", caller="alice") == b"a"
    assert await spill.output("a1", caller="mallory") is None  # never another's
    kept = [f"m{index}" for index in range(6) if await spill.output(f"m{index}")]
    assert kept == ["m3", "m4", "m5"]
    assert await spill.page(None) == ([], None)  # type: ignore[arg-type]
    now[0] += 58.5  # a1 is now 64.5 s old, m5 59.5 s
    assert await spill.get("a1") is None and await spill.get("m5") is not None
    assert spill.keep(record("b1", "bob"), b"b")  # expired ones make room first
    assert not spill.keep(record("big", "bob"), b"x" * (10**6 + 1))
    assert await spill.get("a1") is None and await spill.output("b1") == b"b"
    assert spill.keep(record("b1", "bob"), b"again")  # the same run again: replaced
    assert await spill.output("b1") == b"again"
    await spill.delete("b1")
    assert await spill.get("b1") is None


# ------------------------------------------------------- dropped from a store


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_an_output_retention_dropped_reads_as_not_found_not_as_nothing(
        mode: str) -> None:
    history = RunHistory(output_limit=1000, max_output_bytes=5000)
    async with Client(server(history).fastmcp, mode=mode) as client:
        first = await client.session.call_tool("untyped", {"n": 4000})
        await client.session.call_tool("untyped", {"n": 4000})  # the older one goes
        uri = first.meta["chainweaver"]["output"]["uri"]
        for read in (uri, f"{uri}?offset=0", f"{uri}?offset=10&length=10"):
            assert await missing(client, read) == f"Resource not found: {read!r}"
        # Its record stays, and says what the output was.
        run = json.loads((await client.read_resource(uri.rsplit("/", 1)[0]))[0].text)
    assert run["output_size"] == 4012 and run["status"] == "completed"


# --------------------------------------------------------------- tool forms


@tool(safety=ToolSafetyContract("read"))
def echo(text: str) -> dict[str, str]:
    return {"text": text}


def catalogue() -> FlowServer:
    # 150 flows with 3 KB descriptions full of quotes: the index (about 700 KB) fits
    # one message as a read, but not wrapped in a tool form's JSON, escaped again.
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    for index in range(150):
        executor.registry.register_flow(Flow(
            f"flow_{index:03d}", f'Flow {index} says "' + '"quoted" ' * 300 + '".',
            [FlowStep("echo")]))
    return FlowServer(executor, expose_schemas=True, expose_prompts=True,
                      serving=ServingConfig(resources_as_tools=True, prompts_as_tools=True))


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_form_result_too_large_to_send_is_an_error_naming_the_limit(
        mode: str) -> None:
    async with Client(catalogue().fastmcp, mode=mode) as client:
        index = await client.read_resource("chainweaver://flows")
        assert len(json.loads(index[0].text)["flows"]) == 150
        answers = {name: await client.session.call_tool(name, arguments)
                   for name, arguments in [
                       ("read_resource", {"uri": "chainweaver://flows"}),
                       ("get_prompt", {"name": "chainweaver_guide"}),
                       ("list_resources", {}), ("list_prompts", {})]}
        schema = await client.session.call_tool(
            "read_resource", {"uri": "chainweaver://flows/flow_007/schema"})
    assert not schema.is_error and json.loads(schema.content[0].text)
    # The resources list names no description: 150 entries fit (see test_body_caps
    # for a catalogue whose list does not).
    listed = answers.pop("list_resources")
    assert not listed.is_error and sent(listed) < WIRE_LIMIT
    said = {"read_resource": "The resource 'chainweaver://flows' would take ",
            "get_prompt": "The prompt 'chainweaver_guide' would take ",
            "list_prompts": "The tool result 'list_prompts' would take "}
    for name, answer in answers.items():
        assert answer.is_error and sent(answer) < 4096, name
        text = answer.content[0].text
        assert text.startswith(said[name]), text
        assert f"above the {MESSAGE_BUDGET} bytes one MCP message carries" in text
