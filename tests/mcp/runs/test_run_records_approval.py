"""Run records of flows that ask for approval, through a real in-memory client on both
eras: 2025-11-25 asks by elicitation inside the call, 2026-07-28 answers
``input_required`` and continues the same run on the retry (``waiting_approval`` in
between). Each record says when and what was decided and for which steps, never a
value; a refused run ends ``failed`` with ``ApprovalDenied``; a replayed approval state
never rewrites the run it approved."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from pydantic import BaseModel
from support.mcp_client import raw_call

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import AuditEvent, ExposurePolicy, FlowServer, SecurityConfig
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.runs.approval import APPROVAL_KEY

RUNS = "chainweaver://runs"
SECRET = "4111-1111-SECRET"  # an argument value: never in a record
ORDER = {"card": SECRET, "cents": 100}
CHARGED: list[int] = []


class Order(BaseModel):
    card: str
    cents: int


@tool(safety=ToolSafetyContract("read"))
def validate(order: Order) -> Order:
    return order


@tool(safety=ToolSafetyContract("write", requires_approval=True,
                                approval_reason="charges a card"))
def charge(order: Order) -> Order:
    CHARGED.append(order.cents)
    return order


def serving(audit: list[AuditEvent] | None = None) -> FlowServer:
    CHARGED.clear()
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(validate)
    executor.register_tool(charge)
    executor.registry.register_flow(Flow("pay", "Charges a card.",
                                         [FlowStep("validate"), FlowStep("charge")]))
    hooks = {"audit_hook": audit.append} if audit is not None else {}
    return FlowServer(executor,
                      policy=ExposurePolicy(allowed_side_effects=["none", "read", "write"],
                                            approval="elicit"),
                      security=SecurityConfig(**hooks), run_history=RunHistory())


async def runs(client: Client, query: str = "") -> list[dict[str, Any]]:
    return json.loads((await client.read_resource(f"{RUNS}{query}"))[0].text)["runs"]


async def record_of(client: Client, run_id: str) -> dict[str, Any]:
    return json.loads((await client.read_resource(f"{RUNS}/{run_id}"))[0].text)


def answer(action: str, approve: bool = True) -> dict[str, Any]:
    content = {"approve": approve} if action == "accept" else None
    return {APPROVAL_KEY: {"action": action, "content": content}}


def check_decision(record: dict[str, Any], decision: str) -> None:
    """One approval entry: when (inside the run), what, which steps; nothing else."""
    (entry,) = record["approvals"]
    assert set(entry) == {"at", "decision", "steps"}
    assert entry["decision"] == decision and entry["steps"] == ["charge"]
    assert record["started_at"] <= entry["at"] <= record["ended_at"]
    assert SECRET not in json.dumps(record)


# ------------------------------------------------------------------ 2025-11-25


class Elicited:
    """An elicitation handler that answers ``reply`` and reads the caller's runs while
    the question is open (what a second client of the same caller would see)."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.client: Client | None = None
        self.meanwhile: list[dict[str, Any]] = []

    async def __call__(self, message: str, response_type: Any, params: Any,
                       context: Any) -> Any:
        assert self.client is not None
        self.meanwhile = await runs(self.client)
        return self.reply


@pytest.mark.anyio
async def test_an_elicited_approval_is_recorded_with_its_decision() -> None:
    audit: list[AuditEvent] = []
    asked = Elicited({"approve": True})
    async with Client(serving(audit).fastmcp, mode="legacy",
                      elicitation_handler=asked) as client:
        asked.client = client
        result = await client.call_tool("pay", ORDER)
        run_id = result.meta["chainweaver"]["run_id"]
        record = await record_of(client, run_id)
        listed = await runs(client)
    assert CHARGED == [100]
    # The run was listed while its user was asked: waiting for the answer.
    (open_run,) = asked.meanwhile
    assert open_run["run_id"] == run_id and open_run["status"] == "waiting_approval"
    assert open_run["ended_at"] is None and open_run["approvals"] == []
    assert record["status"] == "completed" and record["error_type"] is None
    assert [step["id"] for step in record["steps"]] == ["validate", "charge"]
    check_decision(record, "accept")
    # Decided before any step ran, not when the run ended.
    assert record["approvals"][0]["at"] <= record["ended_at"]
    assert [r["run_id"] for r in listed] == [run_id]
    (approved,) = [e for e in audit if e.phase == "approval"]
    assert approved.reason == "accept"


@pytest.mark.anyio
@pytest.mark.parametrize(("reply", "decision"), [
    ({"approve": False}, "decline"),
    (ElicitResult(action="decline"), "decline"),
    (ElicitResult(action="cancel"), "cancel"),
])
async def test_a_refused_elicitation_ends_the_run_failed_with_the_answer(
        reply: Any, decision: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "chainweaver.mcp.runs")
    asked = Elicited(reply)
    async with Client(serving().fastmcp, mode="legacy", elicitation_handler=asked) as client:
        asked.client = client
        result = await client.call_tool("pay", ORDER, raise_on_error=False)
        run_id = result.meta["chainweaver"]["run_id"]
        record = await record_of(client, run_id)
        failed = await runs(client, "?status=failed")
    assert result.is_error and CHARGED == []
    assert (record["status"], record["error_type"], record["error_step"]) == (
        "failed", "ApprovalDenied", "charge")  # the step that needed approval
    assert record["steps"] == []  # no step ran
    check_decision(record, decision)
    assert [r["run_id"] for r in failed] == [run_id]
    assert f"run {run_id} of flow 'pay' version 1.0.0 failed at step 'charge': " \
           "ApprovalDenied" in [r.getMessage() for r in caplog.records]


@pytest.mark.anyio
async def test_a_client_that_cannot_be_asked_is_recorded_as_unavailable() -> None:
    async with Client(serving().fastmcp, mode="legacy") as client:
        result = await client.call_tool("pay", ORDER, raise_on_error=False)
        record = await record_of(client, result.meta["chainweaver"]["run_id"])
    assert record["status"] == "failed" and record["error_type"] == "ApprovalDenied"
    check_decision(record, "unavailable")


# ------------------------------------------------------------------ 2026-07-28


@pytest.mark.anyio
async def test_input_required_waits_then_the_retry_completes_the_same_run() -> None:
    audit: list[AuditEvent] = []
    call = {"name": "pay", "arguments": ORDER}
    async with Client(serving(audit).fastmcp, elicitation_handler=Elicited(None)) as client:
        first = await raw_call(client, call)
        assert first["resultType"] == "input_required" and CHARGED == []
        (waiting,) = await runs(client, "?status=waiting_approval")
        assert waiting["flow"] == "pay" and waiting["ended_at"] is None
        assert waiting["steps"] == [] and waiting["approvals"] == []
        assert SECRET not in json.dumps(waiting)

        done = await raw_call(client, {**call, "inputResponses": answer("accept"),
                                       "requestState": first["requestState"]})
        assert done.get("isError") is False and CHARGED == [100]
        run_id = done["_meta"]["chainweaver"]["run_id"]
        record = await record_of(client, run_id)
        listed = await runs(client)
        still_waiting = await runs(client, "?status=waiting_approval")
    assert run_id == waiting["run_id"]  # the retry continued the run that waited
    assert record["started_at"] == waiting["started_at"]
    assert record["status"] == "completed"
    assert [step["id"] for step in record["steps"]] == ["validate", "charge"]
    check_decision(record, "accept")
    assert [r["run_id"] for r in listed] == [run_id] and still_waiting == []
    assert [e.reason for e in audit if e.phase == "approval"] == ["accept"]


@pytest.mark.anyio
@pytest.mark.parametrize(("reply", "decision"), [
    (answer("accept", approve=False), "decline"),
    (answer("decline"), "decline"),
    (answer("cancel"), "cancel"),
    ({}, "no_answer"),
])
async def test_a_refusing_retry_ends_the_waiting_run_failed(reply: dict[str, Any],
                                                             decision: str) -> None:
    call = {"name": "pay", "arguments": ORDER}
    async with Client(serving().fastmcp, elicitation_handler=Elicited(None)) as client:
        first = await raw_call(client, call)
        (waiting,) = await runs(client, "?status=waiting_approval")
        retry = {**call, "requestState": first["requestState"]}
        if reply:
            retry["inputResponses"] = reply
        refused = await raw_call(client, retry)
        record = await record_of(client, waiting["run_id"])
    assert refused["isError"] and CHARGED == []
    assert refused["_meta"]["chainweaver"]["run_id"] == waiting["run_id"]
    assert (record["status"], record["error_type"]) == ("failed", "ApprovalDenied")
    assert record["steps"] == []
    check_decision(record, decision)


@pytest.mark.anyio
async def test_fastmcps_own_retry_leaves_one_completed_run() -> None:
    """FastMCP's client answers input_required itself (its elicitation handler) and
    retries: one run, waiting in between, completed with the decision."""
    asked = Elicited({"approve": True})
    async with Client(serving().fastmcp, elicitation_handler=asked) as client:
        asked.client = client
        result = await client.call_tool("pay", ORDER)
        run_id = result.meta["chainweaver"]["run_id"]
        listed = await runs(client)
    assert CHARGED == [100]
    (open_run,) = asked.meanwhile  # read while the client's user was being asked
    assert (open_run["run_id"], open_run["status"]) == (run_id, "waiting_approval")
    (record,) = listed
    assert record["run_id"] == run_id and record["status"] == "completed"
    check_decision(record, "accept")


@pytest.mark.anyio
async def test_a_replayed_approval_state_never_rewrites_the_run_it_approved() -> None:
    call = {"name": "pay", "arguments": ORDER}
    async with Client(serving().fastmcp, elicitation_handler=Elicited(None)) as client:
        state = (await raw_call(client, call))["requestState"]
        retry = {**call, "inputResponses": answer("accept"), "requestState": state}
        done = await raw_call(client, retry)
        approved = done["_meta"]["chainweaver"]["run_id"]
        before = await record_of(client, approved)
        replayed = await raw_call(client, retry)  # the state approves one retry only
        after = await record_of(client, approved)
        replay_id = replayed["_meta"]["chainweaver"]["run_id"]
        replay = await record_of(client, replay_id)
        listed = await runs(client)
    assert CHARGED == [100] and replayed["isError"]
    assert after == before and after["status"] == "completed"
    assert replay_id != approved
    assert (replay["status"], replay["error_type"]) == ("failed", "ApprovalDenied")
    check_decision(replay, "invalid_state")
    assert [r["run_id"] for r in listed] == [replay_id, approved]
