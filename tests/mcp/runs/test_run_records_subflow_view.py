"""A run record names a sub-flow only while the reader can see it. A caller ran a
visible flow whose sub-flow was in its view then; once that sub-flow left its view (its
token lost the team, or the flow was opted out) while the parent stayed, reading the
record back, or listing it, named the sub-flow and its steps as recorded, where a new
call of the same flow shows one unnamed step, ``subflow#<index>``. Records are masked
in the reader's view when read: steps, the failed step's path and approval paths. On
both eras, on the in-memory and the Redis store. A background task's status and stored
result (``tasks/get``) likewise."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from support.redis_server import redis_server

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import (
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    TaskSettings,
)
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.views import visible_claim

pytestmark = pytest.mark.anyio
HIDDEN = ("ledger", "post_entry", "seal_entry")  # the sub-flow's name and its steps
READ = ToolSafetyContract("read")


@tool(safety=READ)
def post_entry(cents: int) -> dict:
    """Post an entry."""
    if cents < 0:
        raise ValueError("negative")
    return {"posted": cents}


@tool(safety=READ)
def seal_entry(posted: int) -> dict:
    """Seal it."""
    return {"sealed": posted}


@tool(safety=READ)
def record_entry(sealed: int) -> dict:
    """Record it."""
    return {"recorded": sealed}


def catalogue() -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for function in (post_entry, seal_entry, record_entry):
        executor.register_tool(function)
    registry.register_flow(Flow("ledger", "Post and seal.", [
        FlowStep("post_entry"), FlowStep("seal_entry")],
        governance=FlowGovernance(owner="ledger-team")))
    registry.register_flow(Flow("book", "Book an entry.", [
        FlowStep(flow="ledger"), FlowStep("record_entry")],
        governance=FlowGovernance(owner="web")))
    return executor


class Teams:
    """Alice's teams, as her token says now."""

    def __init__(self) -> None:
        self.teams = ["web", "ledger-team"]

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity("alice", {"teams": list(self.teams)}, subject="alice")


@pytest.fixture(params=["memory", pytest.param("redis", marks=[pytest.mark.slow,
                                                                 pytest.mark.tasks])])
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
        return
    with redis_server() as url:
        yield url


async def records(client: Client) -> dict[str, Any]:
    listing = json.loads((await client.read_resource("chainweaver://runs"))[0].text)
    read = [json.loads((await client.read_resource(f"chainweaver://runs/{run['run_id']}"))[
        0].text) for run in listing["runs"]]
    return {"listing": listing, "read": read}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_record_stops_naming_a_sub_flow_that_left_the_readers_view(
        store: str, mode: str) -> None:
    teams = Teams()
    server = FlowServer(catalogue(), security=SecurityConfig(
        authenticator=teams, visible=visible_claim("teams")),
        run_history=RunHistory(store=store))
    async with Client(server.fastmcp, mode=mode) as client:
        done = await client.call_tool("book", {"cents": 5})
        failed = await client.call_tool("book", {"cents": -1}, raise_on_error=False)
        assert failed.is_error
        seen = json.dumps(await records(client))
        assert all(name in seen for name in HIDDEN)  # in view: named as recorded
        teams.teams = ["web"]  # the ledger left alice's view; "book" did not
        assert {t.name for t in await client.list_tools()} == {"book"}
        fresh = await client.call_tool("book", {"cents": 7})
        assert fresh.meta["chainweaver"]["steps"][0]["id"] == "subflow#0"
        now = await records(client)
        text = json.dumps(now)
        assert not [name for name in HIDDEN if name in text], text
        by_id = {run["run_id"]: run for run in now["read"]}
        for meta in (done.meta, failed.meta):
            run = by_id[meta["chainweaver"]["run_id"]]
            assert [step["id"] for step in run["steps"]][0] == "subflow#0"
            assert "steps" not in run["steps"][0]
        assert by_id[failed.meta["chainweaver"]["run_id"]]["error_step"] == "subflow#0"
        assert now["listing"]["runs"] == now["read"]
        # Back in view: the two runs recorded naming it name it again (listed and
        # read); the run made while it was hidden was recorded unnamed and stays so.
        teams.teams = ["web", "ledger-team"]
        assert json.dumps(await records(client)).count('"post_entry"') == 4


def test_masking_cuts_steps_and_paths_at_the_first_sub_flow_out_of_view() -> None:
    from chainweaver.mcp.runs.step_names import masked

    document = {
        "steps": [{"id": "outer", "status": "failed", "steps": [
            {"id": "a", "status": "completed"},
            {"id": "deep", "status": "failed", "steps": [{"id": "z", "status": "failed"}]}]},
            {"id": "plain", "status": "skipped"}],
        "error_step": "outer/deep/z",
        "approvals": [{"at": 1.0, "decision": "accept", "steps": ["outer/deep/z", "plain"]}]}
    subflows = {"outer": ["visible_flow", 0], "outer/deep": ["secret_flow", 1]}
    shown = masked(json.loads(json.dumps(document)), subflows,
                   lambda name: name != "secret_flow")
    assert shown["steps"][0]["steps"][1] == {"id": "subflow#1", "status": "failed"}
    assert shown["error_step"] == "outer/subflow#1"
    assert shown["approvals"][0]["steps"] == ["outer/subflow#1", "plain"]
    assert "secret" not in json.dumps(shown) and '"z"' not in json.dumps(shown)
    # Everything in view: the document as recorded.
    assert masked(json.loads(json.dumps(document)), subflows, lambda name: True) == document


GATE: dict[str, asyncio.Event] = {}


@tool(safety=READ)
async def wait_entry(cents: int) -> dict:
    """Post an entry once the test lets it."""
    if "open" in GATE:
        await GATE["open"].wait()
    if cents < 0:
        raise ValueError("negative")
    return {"posted": cents}


def task_catalogue() -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for function in (wait_entry, seal_entry):
        executor.register_tool(function)
    registry.register_flow(Flow("ledger", "Post and seal.", [
        FlowStep("wait_entry"), FlowStep("seal_entry")],
        governance=FlowGovernance(owner="ledger-team")))
    registry.register_flow(Flow("book", "Book an entry.", [FlowStep(flow="ledger")],
                                governance=FlowGovernance(owner="web")))
    return executor


@pytest.mark.tasks
@pytest.mark.parametrize("detail, failure", [
    ("full", "ValueError: step 'subflow#0' failed"), ("type_only", "ValueError")])
async def test_a_task_stops_naming_a_sub_flow_that_left_its_callers_view(
        detail: str, failure: str) -> None:
    """``tasks/get`` gives a task's status and stored result as written while it ran:
    they named the sub-flow (status ``step 1/1 ledger``, the result's steps, a
    failure's text) after it left the caller's view."""
    from fastmcp_tasks import call_tool_task

    teams = Teams()
    server = FlowServer(task_catalogue(), security=SecurityConfig(
        authenticator=teams, visible=visible_claim("teams"), error_detail=detail),
        tasks=TaskSettings(url="memory://"))
    GATE["open"] = asyncio.Event()
    try:
        async with Client(server.fastmcp) as client:
            running = await call_tool_task(client, "book", {"cents": 5})
            failing = await call_tool_task(client, "book", {"cents": -1})
            for _ in range(500):  # bounded: until the run is inside the sub-flow
                if (await running.status()).status_message == "step 1/1 ledger":
                    break
                await asyncio.sleep(0.01)
            teams.teams = ["web"]
            assert (await running.status()).status_message == "step 1/1 subflow#0"
            teams.teams = ["web", "ledger-team"]
            GATE["open"].set()
            await running.result()
            with pytest.raises(ToolError):
                await failing.result()
            seen = json.dumps([(await task.status()).model_dump(mode="json")
                               for task in (running, failing)])
            assert all(name in seen for name in ("ledger", "wait_entry"))
            teams.teams = ["web"]
            done, failed = [(await task.status()).model_dump(mode="json")
                            for task in (running, failing)]
    finally:
        GATE.clear()
    text = json.dumps([done, failed])
    assert "ledger" not in text and "wait_entry" not in text and "seal_entry" not in text
    assert [s["id"] for s in done["result"]["_meta"]["chainweaver"]["steps"]] == [
        "subflow#0"]
    assert failed["result"]["isError"]
    assert failed["result"]["content"][0]["text"] == failure


@tool(safety=ToolSafetyContract("write", requires_approval=True, approval_reason="posts it"))
def approve_entry(cents: int) -> dict:
    """Post an entry, once approved."""
    return {"posted": cents}


@pytest.mark.tasks
async def test_a_waiting_tasks_question_stops_naming_a_sub_flow_that_left_the_view() -> None:
    """A task waiting for approval of a step inside a sub-flow keeps the question it
    asked: ``tasks/get``'s input request named the sub-flow's step path after the
    sub-flow left the caller's view; it names ``subflow#0`` as a new ask would."""
    from fastmcp_tasks import call_tool_task
    from support.task_asks import answering, waiting

    from chainweaver.mcp import ExposurePolicy

    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(approve_entry)
    registry.register_flow(Flow("ledger", "Post it.", [FlowStep("approve_entry")],
                                governance=FlowGovernance(owner="ledger-team")))
    registry.register_flow(Flow("book", "Book an entry.", [FlowStep(flow="ledger")],
                                governance=FlowGovernance(owner="web")))
    teams = Teams()
    server = FlowServer(executor, tasks="memory://", policy=ExposurePolicy(
        allowed_side_effects=["read", "write"], approval="elicit"),
        security=SecurityConfig(authenticator=teams, visible=visible_claim("teams")))
    async with answering(server) as client:
        task = await call_tool_task(client, "book", {"cents": 5})
        asked = json.dumps(await waiting(task))
        assert "'ledger/approve_entry'" in asked  # in view when asked
        teams.teams = ["web"]
        now = (await task.status()).model_dump(mode="json")
        [request] = now["input_requests"].values()
        question = request["params"]["message"]
        assert "ledger" not in json.dumps(now)
        assert "- step 'subflow#0' (tool 'approve_entry')" in question
        teams.teams = ["web", "ledger-team"]
        again = (await task.status()).model_dump(mode="json")
        [request] = again["input_requests"].values()
        assert "- step 'ledger/approve_entry'" in request["params"]["message"]
        await task.cancel()
