"""A visible flow that runs, as a sub-flow, a flow the caller cannot see never names that
flow (or its steps) to the caller: not in the result's ``_meta``, not in progress or log
messages, not in an error or an approval question, on both protocol eras, nor in a
background task's status. The step is reported as ``subflow#<index>``, with nothing
nested. A sub-flow the caller can see keeps its names."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from fastmcp import Client
from mcp_types import LOG_LEVEL_META_KEY
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import CallerIdentity, ExposurePolicy, FlowServer, SecurityConfig, TaskSettings
from chainweaver.mcp.runs.step_names import StepNames

from .test_runs import Seen

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
READ = ToolSafetyContract("read")
HIDDEN = ("ledger", "post_entry", "seal_entry")  # the hidden flow's name and step ids
POSTED: list[int] = []


class Entry(BaseModel):
    account: str
    cents: int


@tool(safety=READ)
def open_entry(entry: Entry) -> Entry:
    return entry


@tool(safety=READ)
def post_entry(entry: Entry) -> Entry:
    POSTED.append(entry.cents)
    return entry


@tool(safety=READ)
def seal_entry(entry: Entry) -> Entry:
    return entry


@tool(safety=READ)
def record_entry(entry: Entry) -> Entry:
    return entry


@tool(safety=READ)
def reject_entry(entry: Entry) -> Entry:
    raise RuntimeError("ledger refused the entry")


@tool(safety=ToolSafetyContract("write", requires_approval=True, approval_reason="posts"))
def commit_entry(entry: Entry) -> Entry:
    POSTED.append(entry.cents)
    return entry


def hidden_from_callers(caller: CallerIdentity, flow: Flow) -> bool:
    return flow.name not in {"ledger", "strict_ledger", "broken_ledger"}


def books(visible: Any = hidden_from_callers,
          approval: Literal["exclude", "elicit"] = "exclude", **options: Any) -> FlowServer:
    """``book`` runs ``ledger`` (hidden by the view) and ``audit_trail`` (visible)."""
    POSTED.clear()
    executor = FlowExecutor(FlowRegistry())
    for t in (open_entry, post_entry, seal_entry, record_entry, reject_entry, commit_entry):
        executor.register_tool(t)
    register = executor.registry.register_flow
    register(Flow("ledger", "posts an entry", [FlowStep("post_entry"), FlowStep("seal_entry")]))
    register(Flow("audit_trail", "records it", [FlowStep("record_entry")]))
    register(Flow("book", "books an entry", [
        FlowStep("open_entry"), FlowStep(flow="ledger"), FlowStep(flow="audit_trail")]))
    register(Flow("broken_ledger", "fails", [FlowStep("reject_entry")]))
    register(Flow("book_badly", "books into a failing ledger", [
        FlowStep("open_entry"), FlowStep(flow="broken_ledger")]))
    register(Flow("strict_ledger", "posts after approval", [FlowStep("commit_entry")]))
    register(Flow("book_strictly", "books with approval", [
        FlowStep("open_entry"), FlowStep(flow="strict_ledger")]))
    return FlowServer(executor, policy=ExposurePolicy(
        allowed_side_effects=["none", "read", "write"], approval=approval),
        security=SecurityConfig(visible=visible), **options)


ENTRY = {"account": "acme", "cents": 250}


def _texts(result: Any, seen: Seen) -> str:
    return " ".join([str(result.meta), str([c.text for c in result.content]),
                     str(seen.progress), str(seen.logs), str(seen.asked)])


def _no_hidden_name(text: str) -> None:
    for name in HIDDEN + ("strict_ledger", "broken_ledger", "commit_entry" + "/"):
        assert name not in text, name


@pytest.mark.parametrize("mode", ERAS)
async def test_a_hidden_sub_flow_is_one_unnamed_step(mode: str) -> None:
    server = books()
    seen = Seen()
    meta = None if mode == "legacy" else {LOG_LEVEL_META_KEY: "debug"}
    async with seen.client(server, mode) as client:
        if mode == "legacy":
            await client.set_logging_level("debug")
        names = {t.name for t in await client.list_tools()}
        assert "ledger" not in names and "book" in names
        result = await client.call_tool("book", ENTRY, meta=meta)
    assert not result.is_error and POSTED == [250]
    steps = result.meta["chainweaver"]["steps"]
    assert [s["id"] for s in steps] == ["open_entry", "subflow#1", "audit_trail"]
    assert "steps" not in steps[1]  # nothing inside it is listed
    assert [s["id"] for s in steps[2]["steps"]] == ["record_entry"]  # visible: named
    assert [m for _, _, m in seen.progress] == [
        "step 'open_entry' completed", "step 'subflow#1' completed",
        "step 'audit_trail' completed"]
    assert ("info", "step 'subflow#1' started") in seen.logs
    _no_hidden_name(_texts(result, seen))


@pytest.mark.parametrize("mode", ERAS)
async def test_without_a_view_rule_every_sub_flow_is_named(mode: str) -> None:
    server = books(visible=None)
    seen = Seen()
    async with seen.client(server, mode) as client:
        result = await client.call_tool("book", ENTRY)
    steps = result.meta["chainweaver"]["steps"]
    assert [s["id"] for s in steps] == ["open_entry", "ledger", "audit_trail"]
    assert [s["id"] for s in steps[1]["steps"]] == ["post_entry", "seal_entry"]


async def test_a_sub_flow_outside_the_exposure_is_not_named() -> None:
    """No view rule, but a sub-flow the server does not publish (here: a server that
    only publishes flows named ``book*``) is a flow the caller cannot see either. An
    archived sub-flow unpublishes its parent (only active flows run as sub-flows)."""
    server = books(visible=None)
    snapshot = server._provider.exposure.current
    names = StepNames(snapshot.tool("book").plan,
                      lambda name: snapshot.flow(name) is not None and name.startswith("book"))
    assert names.label("ledger") == "subflow#1" and names.label("audit_trail") == "subflow#2"
    server.executor.registry.set_lifecycle("ledger", "archived")
    async with Client(server.fastmcp) as client:
        assert "book" not in {t.name for t in await client.list_tools()}


@pytest.mark.parametrize("mode", ERAS)
async def test_a_failing_hidden_sub_flow_is_not_named_in_the_error(mode: str) -> None:
    server = books()
    seen = Seen()
    async with seen.client(server, mode) as client:
        if mode == "legacy":
            await client.set_logging_level("debug")
        result = await client.call_tool("book_badly", ENTRY, raise_on_error=False)
    assert result.is_error
    assert result.content[0].text == "RuntimeError: step 'subflow#1' failed"
    assert ("error", "step 'subflow#1' failed (RuntimeError)") in seen.logs
    _no_hidden_name(_texts(result, seen))


@pytest.mark.parametrize("mode", ERAS)
async def test_an_approval_inside_a_hidden_sub_flow_does_not_name_it(mode: str) -> None:
    server = books(approval="elicit")
    seen = Seen({"approve": False})
    async with seen.client(server, mode) as client:
        result = await client.call_tool("book_strictly", ENTRY, raise_on_error=False)
    assert result.is_error and POSTED == []
    (question,) = seen.asked
    assert "subflow#1" in question
    _no_hidden_name(_texts(result, seen))


@pytest.mark.tasks  # needs the tasks extra
async def test_a_task_status_does_not_name_a_hidden_sub_flow() -> None:
    from fastmcp_tasks import call_tool_task

    server = books(tasks=TaskSettings(url="memory://", mode="optional"))
    statuses: list[str] = []
    async with Client(server.fastmcp) as client:
        task = await call_tool_task(client, "book", ENTRY)
        result = await task.result()
        status = await task.status()
        statuses.append(str(status))
    assert not result.is_error and POSTED == [250]
    steps = result.meta["chainweaver"]["steps"]
    assert [s["id"] for s in steps] == ["open_entry", "subflow#1", "audit_trail"]
    _no_hidden_name(str(result.meta) + " ".join(statuses))


def test_step_paths_are_cut_at_the_first_hidden_sub_flow() -> None:
    server = books()
    plan = server._provider.exposure.tool("book").plan
    names = StepNames(plan, lambda name: name != "ledger")
    assert names.path("ledger/post_entry") == "subflow#1"
    assert names.path("ledger") == "subflow#1"
    assert names.path("audit_trail/seal_entry") == "audit_trail/seal_entry"
    assert names.path("open_entry") == "open_entry"
    assert names.hides("ledger") and not names.hides("audit_trail") and names.hides_any()


# --------------------------------------------- engine messages that name a hidden flow

LEDGER_READ = ToolSafetyContract("read")


@tool(safety=LEDGER_READ)
def ledger_open(cents: int) -> dict:
    return {"cents": cents}


@tool(safety=LEDGER_READ)
def ledger_receipt(cents: int) -> dict:
    return {"receipt": f"r{cents}"}


@tool(safety=LEDGER_READ)
def ledger_reject(cents: int) -> dict:
    raise RuntimeError("the ledger refused it")


@tool(safety=LEDGER_READ)
def ledger_describe(receipt: str) -> dict:
    return {"summary": receipt}


def ledger_server() -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    for t in (ledger_open, ledger_receipt, ledger_reject, ledger_describe):
        executor.register_tool(t)
    register = executor.registry.register_flow
    register(Flow("secret_ledger", "hidden", [FlowStep("ledger_receipt")]))
    register(Flow("secret_rejects", "hidden", [FlowStep("ledger_reject")]))
    register(Flow("wrapper", "visible, runs a hidden one", [FlowStep(flow="secret_rejects")]))
    register(Flow("nested", "a hidden flow one level down fails",
                  [FlowStep("ledger_open"), FlowStep(flow="wrapper")]))
    register(Flow("skipping", "a skipped hidden step leaves a later one without input",
                  [FlowStep("ledger_open"), FlowStep(flow="secret_ledger", when="cents > 100"),
                   FlowStep("ledger_describe")]))

    def visible(caller: Any, flow: Flow) -> bool:
        return not flow.name.startswith("secret_")

    return FlowServer(executor, security=SecurityConfig(visible=visible))


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize(("flow", "failed"), [("nested", "wrapper"),
                                              ("skipping", "ledger_describe")])
async def test_no_error_text_names_a_hidden_flow_from_any_step(
        mode: str, flow: str, failed: str) -> None:
    async with Client(ledger_server().fastmcp, mode=mode) as client:
        result = await client.call_tool(flow, {"cents": 5}, raise_on_error=False)
    text = " ".join(block.text for block in result.content)
    assert result.is_error and f"step {failed!r} failed" in text
    everything = text + json.dumps(result.meta)
    assert "secret_" not in everything and "ledger_reject" not in everything
    assert "ledger_receipt" not in everything
