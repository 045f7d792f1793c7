"""Approval keeps its meaning through a real MCP client, on both protocol eras: a step
whose grant decision changes after the user approved (the caller's grant revoked, a
delegation covering it now) asks the user again; declined, the run stops before the
step's effect; a hidden sub-flow stays unnamed in the question asked again."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from pydantic import BaseModel

from chainweaver import (
    Delegation,
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import (
    AuditEvent,
    CallerIdentity,
    ExposurePolicy,
    FlowServer,
    GateContext,
    SecurityConfig,
)

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
RAN: list[str] = []
REVOKED: set[str] = set()
REVOKE_DURING: list[str] = []  # "load": the load step revokes the export grant
EXPORTS = ToolSafetyContract("write", requires_approval=True,
                             approval_reason="exports the order")


class Order(BaseModel):
    order: str


@tool(safety=ToolSafetyContract("read"), requires=["orders.read"])
def load(order: str) -> Order:
    RAN.append("load")
    if "load" in REVOKE_DURING:
        REVOKED.add("orders.export")
    return Order(order=order)


@tool(safety=EXPORTS, requires=["orders.export"])
def export(order: str) -> Order:
    RAN.append("export")
    return Order(order=order)


SHAKY = {"left": 0}


@tool(safety=ToolSafetyContract("write", idempotent=True, requires_approval=True,
                                approval_reason="exports the order"),
      requires=["orders.export"])
def shaky_export(order: str) -> Order:
    RAN.append("shaky_export")
    if SHAKY["left"] > 0:  # the first attempt fails, and the grant goes meanwhile
        SHAKY["left"] -= 1
        REVOKED.add("orders.export")
        raise ConnectionError("export endpoint busy")
    return Order(order=order)


def authenticate(ctx: GateContext) -> CallerIdentity:
    return CallerIdentity("ann", {"sub": "ann"}, subject="ann",
                          scopes=frozenset({"orders.read", "orders.export"}))


def refresh(caller: CallerIdentity) -> CallerIdentity:
    """The caller as the directory says it is now: revoked scopes are gone."""
    return CallerIdentity(caller.id, caller.claims, subject=caller.subject,
                          scopes=caller.scopes - REVOKED)


def serving() -> tuple[FlowServer, list[AuditEvent]]:
    RAN.clear()
    REVOKED.clear()
    REVOKE_DURING.clear()
    SHAKY["left"] = 0
    executor = FlowExecutor(FlowRegistry())
    for item in (load, export, shaky_export):
        executor.register_tool(item)
    register = executor.registry.register_flow
    service = "the export service runs it"
    register(Flow("export_order", "load, then export", [FlowStep("load"),
                                                        FlowStep("export")],
                  delegations=[Delegation("export", service)]))
    register(Flow("exporter", "exports", [FlowStep("export")],
                  governance=FlowGovernance(publish=False)))
    register(Flow("archive_order", "load, then export in a hidden sub-flow", [
        FlowStep("load"), FlowStep(flow="exporter", id="archive")],
        delegations=[Delegation("archive/export", service)]))
    retrying = FlowStep("shaky_export", retry=RetryPolicy(
        max_attempts=2, backoff_seconds=0, retry_on=[ConnectionError]))
    register(Flow("retried_export", "export, retried", [FlowStep("load"), retrying],
                  delegations=[Delegation("shaky_export", service)]))
    register(Flow("retried_undelegated", "export, retried", [FlowStep("load"),
                                                             retrying]))
    audit: list[AuditEvent] = []
    server = FlowServer(executor, policy=ExposurePolicy(
        allowed_side_effects=["read", "write"], approval="elicit"),
        security=SecurityConfig(authenticator=authenticate, refresh_caller=refresh,
                                audit_hook=audit.append))
    return server, audit


class User:
    """The client's user: answers each question in turn; the first answer may revoke
    the caller's export grant just before it is given."""

    def __init__(self, *answers: bool, revoke_on_first: bool = False) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []
        self.revoke_on_first = revoke_on_first

    async def __call__(self, message: str, *_: Any) -> Any:
        self.asked.append(message)
        if self.revoke_on_first and len(self.asked) == 1:
            REVOKED.add("orders.export")
        approve = self.answers.pop(0) if self.answers else False
        return {"approve": True} if approve else ElicitResult(action="decline")


def text(result: Any) -> str:
    return " ".join(c.text for c in result.content)


def answers(audit: list[AuditEvent]) -> list[str]:
    return [e.reason for e in audit if e.phase == "approval"]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_grant_revoked_while_the_user_decides_asks_again(mode: str) -> None:
    """Revoked between the question and the answer: on 2025-11-25 the run asks again
    by elicitation before the export (the load ran); on 2026-07-28 the retry carries
    a state asked under other decisions, so a fresh question comes before any step."""
    server, audit = serving()
    user = User(True, True, revoke_on_first=True)
    async with Client(server.fastmcp, mode=mode, elicitation_handler=user) as client:
        result = await client.call_tool("export_order", {"order": "A-1"})
    assert not result.is_error and RAN == ["load", "export"]
    first, again = user.asked
    assert "- step 'export' (tool 'export')" in first and "asks again" not in first
    assert "- step 'export' (tool 'export')" in again
    if mode == "legacy":
        assert again.startswith("The run was approved, but the grant decision of step "
                                "'export' changed since; it asks again.")
        assert answers(audit) == ["accept", "accept"]
    else:
        assert again.startswith("Asked again: the grant decisions of its steps changed "
                                "since it was asked.")
        assert answers(audit) == ["accept"]  # the first answer was for another question


@pytest.mark.parametrize("mode", ERAS)
async def test_declining_the_question_asked_again_runs_no_export(mode: str) -> None:
    server, audit = serving()
    user = User(True, False, revoke_on_first=True)
    async with Client(server.fastmcp, mode=mode, elicitation_handler=user) as client:
        result = await client.call_tool("export_order", {"order": "A-1"},
                                        raise_on_error=False)
    assert result.is_error and len(user.asked) == 2
    assert text(result).startswith("ApprovalDenied:")
    assert "export" not in RAN  # stopped before the step's effect
    assert RAN == (["load"] if mode == "legacy" else [])
    assert answers(audit)[-1] == "decline"


@pytest.mark.parametrize("mode", ERAS)
async def test_a_grant_revoked_mid_run_asks_again_or_stops_before_the_step(
        mode: str) -> None:
    """Revoked by the step before: 2025-11-25 asks again over its back-channel;
    2026-07-28 cannot hold the call open for an answer, so the run stops there."""
    server, audit = serving()
    REVOKE_DURING.append("load")
    user = User(True, True)
    async with Client(server.fastmcp, mode=mode, elicitation_handler=user) as client:
        result = await client.call_tool("export_order", {"order": "A-1"},
                                        raise_on_error=False)
    if mode == "legacy":
        assert not result.is_error and RAN == ["load", "export"]
        assert len(user.asked) == 2 and answers(audit) == ["accept", "accept"]
        assert "allowed by the flow's delegation" not in user.asked[1]  # says only what
    else:
        assert result.is_error and RAN == ["load"] and len(user.asked) == 1
        assert text(result).startswith("ApprovalDenied: step 1 ('export'): it was "
                                        "approved as allowed by the caller's own grants")
        assert text(result).endswith("(answer: unavailable)")
        assert answers(audit) == ["accept", "unavailable"]
    steps = [e for e in audit if e.phase == "completed" and e.kind == "tool"][-1].steps
    assert steps is not None and steps["steps"][-1]["path"] == "export"
    refused = steps["refused"]
    if mode == "legacy":
        assert refused is None
    else:  # the operator's audit says why the step did not run
        assert (refused["path"], refused["reason"]) == ("export", "approval_not_renewed")


@pytest.mark.parametrize("mode", ["legacy"])
async def test_a_hidden_sub_flow_is_not_named_when_asked_again(mode: str) -> None:
    server, audit = serving()
    REVOKE_DURING.append("load")
    user = User(True, False)
    async with Client(server.fastmcp, mode=mode, elicitation_handler=user) as client:
        result = await client.call_tool("archive_order", {"order": "A-1"},
                                        raise_on_error=False)
    assert result.is_error and RAN == ["load"] and len(user.asked) == 2
    for said in (*user.asked, text(result), str(result.meta)):
        assert "exporter" not in said and "archive/export" not in said
    assert "'subflow#1'" in user.asked[1]
    assert text(result).startswith("ApprovalDenied: step 'subflow#1': its grant decision "
                                   "changed after the run was approved")


@pytest.mark.parametrize("mode", ERAS)
async def test_a_retry_after_the_grant_went_asks_again_or_is_refused(mode: str) -> None:
    """The grant goes between two attempts of a step: with a delegation covering it,
    the retry is asked about again (2025-11-25) or stops (2026-07-28: no back-channel);
    without one, the retry is refused as any step, and nothing is asked again."""
    server, audit = serving()
    SHAKY["left"] = 1
    user = User(True, False)
    async with Client(server.fastmcp, mode=mode, elicitation_handler=user) as client:
        result = await client.call_tool("retried_export", {"order": "A-1"},
                                        raise_on_error=False)
        assert result.is_error and text(result).startswith("ApprovalDenied:")
        assert RAN == ["load", "shaky_export"]  # the retry never ran
        assert len(user.asked) == (2 if mode == "legacy" else 1)
        RAN.clear()
        REVOKED.clear()
        SHAKY["left"] = 1
        user.answers = [True]
        asked = len(user.asked)
        refused = await client.call_tool("retried_undelegated", {"order": "A-1"},
                                         raise_on_error=False)
    assert refused.is_error and text(refused).startswith("StepRefused:")
    assert RAN == ["load", "shaky_export"] and len(user.asked) == asked + 1
    steps = [e for e in audit if e.phase == "completed" and e.kind == "tool"][-1].steps
    assert steps is not None and steps["refused"]["reason"] == "missing_grant"
    assert [e.reason for e in audit if e.phase == "step"][-1] == "missing_grant"
