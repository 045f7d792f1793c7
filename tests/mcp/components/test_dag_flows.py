"""DAG flows through MCP: fan-out, conditions, retries, fallbacks and sub-flows called with
``tools/call`` in memory, with the per-step records in the result's ``_meta``; and the
static data-flow check excluding flows that can never succeed."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest
from fastmcp import Client
from pydantic import BaseModel

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import FlowServer, SecurityConfig

READ = ToolSafetyContract("read")
CALLS: Counter[str] = Counter()


class Ticket(BaseModel):
    ticket_id: str
    priority: int


class Customer(BaseModel):
    customer: str


class History(BaseModel):
    past_tickets: int


class Reply(BaseModel):
    reply: str


@tool(safety=READ)
def load_ticket(ticket_id: str) -> Ticket:
    return Ticket(ticket_id=ticket_id, priority=3 if ticket_id.startswith("P") else 1)


@tool(safety=READ)
async def load_customer(ticket_id: str) -> Customer:
    await asyncio.sleep(0)
    return Customer(customer=f"cust-{ticket_id}")


@tool(safety=READ)
async def load_history(ticket_id: str) -> History:
    await asyncio.sleep(0)
    return History(past_tickets=len(ticket_id))


@tool(safety=READ)
def escalate(ticket_id: str) -> dict:
    return {"escalated": True}


@tool(safety=READ)
def draft_reply(ticket_id: str, customer: str, past_tickets: int,
                escalated: bool = False) -> Reply:
    return Reply(reply=f"{customer}/{ticket_id}/{past_tickets}/{escalated}")


@tool(safety=READ)
def flaky_lookup(ticket_id: str) -> Reply:
    CALLS["flaky_lookup"] += 1
    if CALLS["flaky_lookup"] < 3:
        raise ConnectionError("try again")
    return Reply(reply=f"looked up {ticket_id}")


@tool(safety=READ)
def broken_lookup(ticket_id: str) -> Reply:
    raise RuntimeError("the secret database password is hunter2")


@tool(safety=READ)
def cached_lookup(ticket_id: str) -> Reply:
    return Reply(reply=f"cached {ticket_id}")


@tool(safety=READ)
def needs_account(account_id: str) -> Reply:
    return Reply(reply=account_id)


class TicketIn(BaseModel):
    ticket_id: str


class NeverFilled(BaseModel):
    reply: str
    satisfaction: float


def build() -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for t in (load_ticket, load_customer, load_history, escalate, draft_reply, flaky_lookup,
              broken_lookup, cached_lookup, needs_account):
        executor.register_tool(t)
    flows = [
        Flow("triage", "Load a ticket, its customer and history at once, escalate urgent "
             "ones, then draft a reply.", [
                 FlowStep("load_ticket"),
                 FlowStep("load_customer", after=()),
                 FlowStep("load_history", after=()),
                 FlowStep("escalate", after=["load_ticket"], when="priority >= 3"),
                 FlowStep("draft_reply", after=["escalate", "load_customer", "load_history"]),
             ], input_schema=TicketIn),
        Flow("retrying", "Retry a flaky lookup.", [
            FlowStep("flaky_lookup", retry=RetryPolicy(3, backoff_seconds=0))]),
        Flow("falling_back", "Fall back to the cache.", [
            FlowStep("broken_lookup", on_error="fallback", fallback="cached_lookup")]),
        Flow("failing", "Always fails.", [FlowStep("broken_lookup")]),
        Flow("wrapped", "Triage as a sub-flow.", [FlowStep(flow="triage")]),
        # Can never succeed: no input, earlier step, mapping or default provides
        # account_id; and NeverFilled.satisfaction can never be filled.
        Flow("unsatisfiable", "Broken wiring.", [
            FlowStep("load_ticket"), FlowStep("needs_account")], input_schema=TicketIn),
        Flow("unfillable_output", "Broken output.", [FlowStep("cached_lookup")],
             output_schema=NeverFilled),
    ]
    for flow in flows:
        registry.register_flow(flow)
    return executor


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


async def call(server: FlowServer, name: str, arguments: dict[str, Any]):
    async with Client(server.fastmcp) as client:
        return await client.call_tool(name, arguments, raise_on_error=False)


def steps_meta(result) -> list[dict[str, Any]]:
    steps = result.meta["chainweaver"]["steps"]
    assert all(isinstance(s["duration_ms"], (int, float)) for s in steps)
    assert all(isinstance(s["started_ms"], (int, float)) for s in steps)
    return [{k: v for k, v in s.items() if k not in ("duration_ms", "started_ms")}
            for s in steps]


@pytest.mark.anyio
async def test_a_conditional_fan_out_flow_runs_through_tools_call() -> None:
    server = FlowServer(build())
    urgent = await call(server, "triage", {"ticket_id": "P-7"})
    assert not urgent.is_error
    assert urgent.structured_content == {"reply": "cust-P-7/P-7/3/True"}
    assert steps_meta(urgent) == [
        {"id": "load_ticket", "status": "completed", "attempts": 1},
        {"id": "load_customer", "status": "completed", "attempts": 1},
        {"id": "load_history", "status": "completed", "attempts": 1},
        {"id": "escalate", "status": "completed", "attempts": 1},
        {"id": "draft_reply", "status": "completed", "attempts": 1},
    ]
    routine = await call(server, "triage", {"ticket_id": "T-1"})
    assert routine.structured_content == {"reply": "cust-T-1/T-1/3/False"}
    assert steps_meta(routine)[3] == {"id": "escalate", "status": "skipped", "attempts": 0}
    assert routine.meta["chainweaver"]["flow"] == "triage"


@pytest.mark.anyio
async def test_retries_and_fallbacks_show_in_the_meta() -> None:
    server = FlowServer(build())
    retried = await call(server, "retrying", {"ticket_id": "A"})
    assert retried.structured_content == {"reply": "looked up A"}
    assert steps_meta(retried) == [{"id": "flaky_lookup", "status": "completed",
                                    "attempts": 3}]
    fallen = await call(server, "falling_back", {"ticket_id": "A"})
    assert fallen.structured_content == {"reply": "cached A"}
    assert steps_meta(fallen) == [{"id": "broken_lookup", "status": "completed",
                                   "attempts": 2, "fallback": "cached_lookup"}]


@pytest.mark.anyio
async def test_a_failed_step_is_in_the_meta_of_the_error_result() -> None:
    server = FlowServer(build())
    failed = await call(server, "failing", {"ticket_id": "A"})
    assert failed.is_error
    assert steps_meta(failed) == [{"id": "broken_lookup", "status": "failed", "attempts": 1,
                                   "error": "RuntimeError"}]
    assert "hunter2" not in str(failed.meta)  # types only, never the message


@pytest.mark.anyio
async def test_a_sub_flow_runs_as_one_step_through_tools_call() -> None:
    server = FlowServer(build())
    result = await call(server, "wrapped", {"ticket_id": "P-1"})
    assert result.structured_content == {"reply": "cust-P-1/P-1/3/True"}
    [step] = steps_meta(result)
    assert [(s["id"], s["status"]) for s in step.pop("steps")] == [
        ("load_ticket", "completed"), ("load_customer", "completed"),
        ("load_history", "completed"), ("escalate", "completed"),
        ("draft_reply", "completed")]
    assert step == {"id": "triage", "status": "completed", "attempts": 1}


def test_flows_that_can_never_succeed_are_excluded_with_a_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="chainweaver"):
        server = FlowServer(build())
    report = {entry.flow_name: entry for entry in server.exposure_report()}
    assert report["triage"].exposed and report["wrapped"].exposed
    unsatisfiable = report["unsatisfiable"]
    assert not unsatisfiable.exposed
    assert "step 1 ('needs_account')" in unsatisfiable.reason
    assert "'account_id'" in unsatisfiable.reason
    assert "output_schema field 'satisfaction'" in report["unfillable_output"].reason
    assert any("unsatisfiable" in r.getMessage() and "account_id" in r.getMessage()
               for r in caplog.records)


@pytest.mark.anyio
async def test_excluded_flows_are_not_callable() -> None:
    server = FlowServer(build())
    async with Client(server.fastmcp) as client:
        names = {t.name for t in await client.list_tools()}
    assert "unsatisfiable" not in names and "triage" in names


def test_unknown_safety_names_the_sub_flow_and_fallback_behind_it() -> None:
    @tool(safety=ToolSafetyContract("read"))
    def known(text: str) -> dict:
        """Known."""
        return {"text": text}

    @tool
    def unknown(text: str) -> dict:
        """No contract."""
        return {"text": text}

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(known)
    executor.register_tool(unknown)
    executor.registry.register_flow(Flow("child", "Child.", [FlowStep("unknown")]))
    executor.registry.register_flow(Flow("parent", "Parent.", [FlowStep(flow="child")]))
    executor.registry.register_flow(Flow("guarded", "Guarded.", [
        FlowStep("known", on_error="fallback", fallback="unknown")]))
    report = {e.flow_name: e.reason for e in FlowServer(executor).exposure_report()}
    assert report["parent"] == ("effective safety is unknown: no safety contract on the "
                                "flow or on sub-flow(s) 'child'")
    assert report["guarded"] == ("effective safety is unknown: no safety contract on the "
                                 "flow or on tool(s) 'unknown'")


class TextIn(BaseModel):
    # Any, not str: a str input feeding the sub-flow's int field is found statically
    # (InputTypeError) and never published; an untyped one reaches the run.
    x: Any


@tool(safety=READ)
def need_int(x: int) -> dict:
    return {"y": x}


@pytest.mark.anyio
@pytest.mark.parametrize("detail", ["full", "generic"])
async def test_a_sub_flow_given_bad_input_by_its_parent_is_not_the_callers_mistake(
        detail) -> None:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(need_int)
    registry.register_flow(Flow("child", "", [FlowStep("need_int")]))
    registry.register_flow(Flow("parent", "", [FlowStep(flow="child")], input_schema=TextIn))
    result = executor.execute_flow("parent", {"x": "abc"})
    assert (result.error.type, result.error.step_id, result.error.field) == (
        "StepInputError", "child", "x")
    assert result.error.detail and "valid integer" in result.error.detail
    server = FlowServer(executor, security=SecurityConfig(error_detail=detail))
    reply = await call(server, "parent", {"x": "abc"})
    text = reply.content[0].text
    assert reply.is_error and "Invalid arguments" not in text and "None" not in text
    if detail == "full":
        assert text.startswith("StepInputError: step 0 ('child'): sub-flow 'child' failed")


@pytest.mark.anyio
async def test_a_published_flow_runs_the_sub_flow_version_its_exposure_reviewed() -> None:
    calls: Counter[str] = Counter()

    @tool(safety=ToolSafetyContract("read"))
    def look(text: str) -> dict:
        """Read."""
        calls["look"] += 1
        return {"text": text}

    @tool(safety=ToolSafetyContract("destructive"))
    def wipe(text: str) -> dict:
        """Destroy."""
        calls["wipe"] += 1
        return {"text": text}

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(look)
    executor.register_tool(wipe)
    executor.registry.register_flow(Flow("child", "Child.", [FlowStep("look")]))
    executor.registry.register_flow(Flow("parent", "Parent.", [FlowStep(flow="child")]))
    server = FlowServer(executor)
    async with Client(server.fastmcp) as client:
        tools = {listed.name: listed for listed in await client.list_tools()}
        assert tools["parent"].annotations.read_only_hint is True
        result = await client.call_tool("parent", {"text": "x"})
        assert not result.is_error
        # A destructive child version appears: the server follows the registry and
        # judges the parent again, which is now destructive, so no longer published.
        executor.registry.register_flow(Flow("child", "Child.", [FlowStep("wipe")],
                                             version="2.0.0"))
        assert "parent" not in {listed.name for listed in await client.list_tools()}
        refused = await client.call_tool("parent", {"text": "x"}, raise_on_error=False)
    assert refused.is_error
    assert calls == Counter({"look": 1})
