"""Step grants in background tasks (in memory): the task's leg checks every step against
its caller as it is now (``refresh_caller``), a refusal fails the task at that step, and
the task's audit holds each step decision and the refusal."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from fastmcp_tasks import call_tool_task

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import (
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    TaskSettings,
)

pytestmark = [pytest.mark.anyio, pytest.mark.tasks]
READ = ToolSafetyContract("read")
RAN: list[str] = []
REVOKED: set[str] = set()


@tool(safety=READ, requires=["billing.read"])
def read_ledger(account: str) -> dict:
    RAN.append("read_ledger")
    return {"account": account}


@tool(safety=READ)
def revoke(account: str) -> dict:
    RAN.append("revoke")
    REVOKED.add("billing.export")  # the grant goes while the task runs
    return {"account": account}


@tool(safety=READ, requires=["billing.export"])
def export_ledger(account: str) -> dict:
    RAN.append("export_ledger")
    return {"exported": account}


def authenticate(gate: GateContext) -> CallerIdentity:
    return CallerIdentity("ann", {"team": "billing"}, subject="ann",
                          scopes=frozenset({"billing.read", "billing.export"}))


def refresh(caller: CallerIdentity) -> CallerIdentity:
    return CallerIdentity(caller.id, caller.claims, scopes=caller.scopes - REVOKED)


def server(audit: list[AuditEvent]) -> FlowServer:
    RAN.clear()
    REVOKED.clear()
    executor = FlowExecutor(FlowRegistry())
    for item in (read_ledger, revoke, export_ledger):
        executor.register_tool(item)
    executor.registry.register_flow(Flow("export", "reads, then exports", [
        FlowStep("read_ledger"), FlowStep("revoke"), FlowStep("export_ledger")]))
    executor.registry.register_flow(Flow("read", "reads", [FlowStep("read_ledger")]))
    return FlowServer(executor, tasks=TaskSettings(url="memory://", mode="optional"),
                      security=SecurityConfig(authenticator=authenticate,
                                              refresh_caller=refresh,
                                              audit_hook=audit.append))


async def test_a_task_whose_grant_is_revoked_mid_run_stops_at_the_next_step() -> None:
    audit: list[AuditEvent] = []
    async with Client(server(audit).fastmcp) as client:
        task = await call_tool_task(client, "export", {"account": "acme"},
                                    raise_on_error=False)
        result: Any = await task.result()
    assert result.is_error and "StepRefused" in result.content[0].text
    assert RAN == ["read_ledger", "revoke"]
    step = [e for e in audit if e.kind == "task" and e.phase == "step"]
    assert [(e.decision, e.step_id, e.reason, e.caller_id) for e in step] == [
        ("denied", "export_ledger", "missing_grant", "ann")]
    (done,) = [e for e in audit if e.kind == "task" and e.phase == "completed"
               and e.task_status == "completed"]
    assert done.steps is not None and done.steps["denied"] == 1
    assert [s["path"] for s in done.steps["steps"]] == ["read_ledger", "revoke",
                                                        "export_ledger"]


async def test_a_task_keeps_its_callers_grants_for_the_worker() -> None:
    audit: list[AuditEvent] = []
    async with Client(server(audit).fastmcp) as client:
        task = await call_tool_task(client, "read", {"account": "acme"})
        result: Any = await task.result()
    assert not result.is_error and RAN == ["read_ledger"]
    (done,) = [e for e in audit if e.kind == "task" and e.phase == "completed"
               and e.task_status == "completed"]
    assert done.steps is not None and done.steps["allowed"] == 1
