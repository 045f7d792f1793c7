"""Each caller's runs stay its own whatever its id, on both stores: keys built from
caller ids and flow names cannot spell one another (``team`` listing flow ``alpha``
once read the Redis key that holds every run of caller ``team:alpha``), and every
record a store gives back, listed or read, is the asking caller's (lone surrogates
included: a token's ``"sub": "\\ud800"`` holds one). Through the stores themselves,
through a real MCP client on both eras, and where a run continues a record it reads
back by id (the operator's ``chainweaver runs list --caller``:
tests/cli/test_cli_runs_callers.py)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from support.mcp_client import raw_call
from support.run_records import Text, shout

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import (
    CallerIdentity,
    ExposurePolicy,
    FlowServer,
    GateContext,
    SecurityConfig,
)
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.publish.exposure import Exposure
from chainweaver.mcp.runs.approval import APPROVAL_KEY
from chainweaver.mcp.runs.recording import RunLog, RunRecorder, run_start
from chainweaver.mcp.runs.records import MemoryRunStore, RunQuery, RunRecord, RunStore
from chainweaver.mcp.runs.step_names import ALL_VISIBLE

# Pairs that met in one Redis key before keys were encoded: (team, alpha) and
# (team:alpha, *); (team, alpha:beta) and (team:alpha, beta); and the rest of the
# alphabet a key layout must keep apart, lone surrogates included (a token's
# "sub": "\ud800" gives one; Redis keys could not spell them).
CALLERS = ["team", "team:alpha", "team|alpha", "a/b", "*", "ünï-名", "", "%74eam", "team:",
           "\ud800", "\udcff", "%ED%A0%80", "a\0b", "\n\x1b[2J"]
FLOWS = ["alpha", "alpha:beta", "beta", "*", "名", "%61lpha"]


@pytest.fixture(params=["memory", pytest.param("redis", marks=[pytest.mark.slow,
                                                                 pytest.mark.tasks])])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[RunStore]:
    if request.param == "memory":
        yield MemoryRunStore()
        return
    from chainweaver.mcp.runs.redis_records import RedisRunStore

    redis = RedisRunStore(request.getfixturevalue("redis_url"),
                          prefix=f"callers:{time.time_ns()}")
    try:
        yield redis
    finally:
        await redis.close()


def output_of(caller: str) -> bytes:
    return caller.encode("utf-8", "surrogatepass") or b"-"


def ids(records: list[RunRecord]) -> list[str]:
    return [record.run_id for record in records]


@pytest.mark.anyio
async def test_no_caller_id_or_flow_name_reaches_another_callers_runs(store: RunStore
                                                                       ) -> None:
    now = time.time()
    runs: dict[tuple[str, str], str] = {}
    for seq, (caller, flow) in enumerate(itertools.product(CALLERS, FLOWS)):
        run_id = f"{seq:024x}"
        runs[caller, flow] = run_id
        await store.save(RunRecord(run_id, flow, "1.0.0", flow, caller,
                                   int(now * 1e6) + seq, now), new=True)
        await store.put_output(run_id, output_of(caller))
    for caller in CALLERS:
        own = {key: run_id for key, run_id in runs.items() if key[0] == caller}
        listed, cursor = await store.page(RunQuery(caller=caller, limit=100))
        assert ids(listed) == sorted(own.values(), reverse=True) and cursor is None
        for flow in [*FLOWS, "alpha:beta:gamma", ""]:
            by_flow, _ = await store.page(RunQuery(caller=caller, flow=flow))
            assert ids(by_flow) == [own[caller, f] for f in [flow] if (caller, f) in own], \
                (caller, flow)
        for (owner, _flow), run_id in runs.items():
            record = await store.get(run_id, caller=caller)
            output = await store.output(run_id, caller=caller)
            ranged = await store.output(run_id, 0, 1, caller=caller)
            if owner == caller:
                assert record is not None and record.caller == caller
                assert output == output_of(caller) and ranged == output[:1]
            else:
                assert (record, output, ranged) == (None, None, None), (caller, owner)
    # The operator's listing (no caller) still sees everybody's.
    everyone, _ = await store.page(RunQuery(limit=100))
    assert sorted(ids(everyone)) == sorted(runs.values())


# ------------------------------------------------------------------- through MCP


class Switch:
    """The caller of every request: whoever the test says is calling now."""

    def __init__(self) -> None:
        self.who = ""

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who, subject=self.who)


def catalogue() -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(shout)
    for flow in ("alpha", "beta"):
        registry.register_flow(Flow(flow, f"Shouts ({flow}).", [FlowStep("shout")]))
    return executor


async def listing(client: Client, query: str = "") -> list[str]:
    page = json.loads((await client.read_resource(f"chainweaver://runs{query}"))[0].text)
    return [run["run_id"] for run in page["runs"]]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("store_url", ["memory://", pytest.param(
    "redis", marks=[pytest.mark.slow, pytest.mark.tasks])])
async def test_team_never_reads_the_runs_of_team_colon_alpha(
        mode: str, store_url: str, request: pytest.FixtureRequest) -> None:
    if store_url == "redis":
        store_url = request.getfixturevalue("redis_url")
    switch = Switch()
    server = FlowServer(catalogue(), security=SecurityConfig(authenticator=switch),
                        run_history=RunHistory(
                            store=store_url, prefix=f"team:{time.time_ns()}"))
    started: dict[str, list[str]] = {}
    for who, flows in (("team", ["alpha"]), ("team:alpha", ["beta", "beta"])):
        switch.who = who
        async with Client(server.fastmcp, mode=mode) as client:
            for flow in flows:
                result = await client.session.call_tool(flow, {"text": who})
                started.setdefault(who, []).append(result.meta["chainweaver"]["run_id"])
    for who, other in (("team", "team:alpha"), ("team:alpha", "team")):
        switch.who = who
        async with Client(server.fastmcp, mode=mode) as client:
            mine = started[who][::-1]
            assert await listing(client) == mine
            assert await listing(client, "?flow=alpha") == (mine if who == "team" else [])
            assert await listing(client, "?flow=beta") == (mine if who != "team" else [])
            for run_id in started[other]:
                for uri in (f"chainweaver://runs/{run_id}",
                            f"chainweaver://runs/{run_id}/output"):
                    with pytest.raises(MCPError) as missing:
                        await client.read_resource(uri)
                    assert missing.value.error.message == f"Resource not found: {uri!r}"
            read: Any = await client.read_resource(f"chainweaver://runs/{mine[0]}")
            assert json.loads(read[0].text)["run_id"] == mine[0]


@tool(safety=ToolSafetyContract("write", requires_approval=True, approval_reason="stamps"))
def stamp(data: Text) -> Text:
    return Text(text=f"stamped {data.text}")


async def never_asked(*args: Any) -> None:
    raise AssertionError("the 2026-07-28 server answers input_required instead")


@pytest.mark.anyio
async def test_a_run_that_asks_approval_is_its_callers_whatever_the_id() -> None:
    # A 2026-07-28 call that asks for approval moves its run to an id derived from
    # the caller id and the approval state: a caller id holding a lone surrogate
    # once failed that call ("failed unexpectedly in run records").
    switch = Switch()
    executor = catalogue()
    executor.register_tool(stamp)
    executor.registry.register_flow(Flow("gamma", "Stamps.", [FlowStep("stamp")]))
    server = FlowServer(executor,
                        policy=ExposurePolicy(allowed_side_effects=["none", "read", "write"],
                                              approval="elicit"),
                        security=SecurityConfig(authenticator=switch), run_history=RunHistory())
    call = {"name": "gamma", "arguments": {"text": "x"}}
    for who in ("\udcff", "\udcfe"):
        switch.who = who
        async with Client(server.fastmcp, elicitation_handler=never_asked) as client:
            asked = await raw_call(client, call)
            assert asked["resultType"] == "input_required", asked
            waiting = await listing(client, "?status=waiting_approval")
            reply = {APPROVAL_KEY: {"action": "accept", "content": {"approve": True}}}
            done = await raw_call(client, {**call, "inputResponses": reply,
                                           "requestState": asked["requestState"]})
            assert done["isError"] is False, done
            run_id = done["_meta"]["chainweaver"]["run_id"]
            assert waiting == [run_id] and await listing(client) == [run_id]
            read: Any = await client.read_resource(f"chainweaver://runs/{run_id}")
            assert json.loads(read[0].text)["status"] == "completed"


@pytest.mark.anyio
async def test_a_run_that_names_another_callers_record_never_continues_it(
        store: RunStore) -> None:
    # A run that continues a record (a task's later leg, an approval's retry) reads
    # it back by id: one that is another caller's is left as it is, and the run is
    # filed under an id of its own.
    now = time.time()
    theirs = RunRecord("ab" * 12, "alpha", "1.0.0", "alpha", "team:alpha",
                       int(now * 1e6), now, status="waiting_approval")
    await store.save(theirs, new=True)
    exposed = Exposure(catalogue(), ExposurePolicy()).flow("alpha")
    assert exposed is not None
    recorder = RunRecorder(RunLog(RunHistory(), store), exposed,
                           run_start(theirs.run_id, "team"), ALL_VISIBLE)
    await recorder.begin()
    assert recorder.run_id != theirs.run_id
    assert await store.get(theirs.run_id, caller="team:alpha") == theirs
    assert await store.get(theirs.run_id, caller="team") is None
    mine = await store.get(recorder.run_id, caller="team")
    assert mine is not None and mine.status == "running"
