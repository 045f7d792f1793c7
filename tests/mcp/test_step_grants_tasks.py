"""Step grants in background tasks (in memory): the task's leg checks every step against
its caller as it is now (``refresh_caller``), a refusal fails the task at that step, and
the task's audit holds each step decision and the refusal."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from fastmcp_tasks import call_tool_task
from support.polling import until
from support.task_asks import LIMIT, answering, reply, update_task, waiting

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
    AuditEvent,
    CallerIdentity,
    ExposurePolicy,
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


@tool(safety=READ)
def load(account: str) -> dict:
    RAN.append("load")
    return {"account": account}


@tool(safety=ToolSafetyContract("write", requires_approval=True, approval_reason="ships"))
def ship(account: str) -> dict:
    RAN.append("ship")
    return {"shipped": account}


async def test_a_task_keeps_its_callers_grants_when_a_sub_flow_asks_for_one_later() -> None:
    # When the task is created its flow declares no grant at any depth; while it waits
    # for approval, its sub-flow's new version runs a tool that needs billing.read. The
    # answered leg must judge that step (and the view) as the task's caller, who holds
    # the grant: it was judged as nobody (no token in memory) and the task failed as
    # "no longer published here".
    audit: list[AuditEvent] = []
    flows = server(audit)
    for item in (load, ship):
        flows.executor.register_tool(item)
    register = flows.executor.registry.register_flow
    hidden = FlowGovernance(publish=False)
    register(Flow("inner", "d", [FlowStep("load", id="inner_load")], governance=hidden))
    register(Flow("shipping", "loads, then ships", [FlowStep("load"),
                                                   FlowStep(flow="inner"),
                                                   FlowStep("ship")]))
    approving = FlowServer(flows.executor, tasks=TaskSettings(url="memory://",
                                                              mode="optional"),
                           policy=ExposurePolicy(allowed_side_effects=["read", "write"],
                                                 approval="elicit"),
                           security=flows.security)
    async with answering(approving) as client:
        task = await call_tool_task(client, "shipping", {"account": "acme"},
                                    raise_on_error=False)
        requests = await waiting(task)
        register(Flow("inner", "d", [FlowStep("read_ledger")], version="2.0.0",
                      governance=hidden))
        for _ in range(2):  # the changed grant decisions may be asked about once more
            await update_task(task, reply(requests, "accept", {"approve": True}))
            asked = set(requests)

            async def moved_on(asked: set[str] = asked) -> Any:
                now = await task.status()
                if now.status == "input_required" and set(now.input_requests) != asked:
                    return now
                return now if now.status in ("completed", "failed") else None

            status = await until(moved_on, "the task to ask again or end", LIMIT)
            if status.status != "input_required":
                break
            requests = status.input_requests
        result: Any = await task.result()
    assert status.status == "completed", status
    assert not result.is_error, result.content
    assert RAN == ["load", "read_ledger", "ship"]
    (done,) = [e for e in audit if e.kind == "task" and e.phase == "completed"
               and e.task_status == "completed"]
    assert done.steps is not None and done.steps["denied"] == 0


async def test_a_task_s_steps_see_the_caller_the_call_would_see() -> None:
    # The step hooks of a task's leg are shown the caller the gate admitted: its id,
    # subject, client id, scopes and claims (the subject and client id were lost, so a
    # directory keyed by subject, or a rule over it, judged a task as nobody's).
    seen: list[tuple[Any, ...]] = []

    def by_subject(caller: CallerIdentity) -> CallerIdentity | None:
        if caller.subject != "ann-subject":
            return None  # the directory knows no such person
        return caller

    def who(request: Any) -> bool:
        caller = request.caller
        seen.append((caller.id, caller.subject, caller.client_id, caller.scopes,
                     dict(caller.claims)))
        return True

    def authenticate_ann(gate: GateContext) -> CallerIdentity:
        return CallerIdentity("ann", {"team": "billing"}, subject="ann-subject",
                              client_id="desk", scopes=frozenset({"billing.read"}))

    RAN.clear()
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(read_ledger)
    executor.registry.register_flow(Flow("read", "reads", [FlowStep("read_ledger")]))
    served = FlowServer(executor, tasks=TaskSettings(url="memory://", mode="optional"),
                        security=SecurityConfig(authenticator=authenticate_ann,
                                                refresh_caller=by_subject,
                                                step_authorizer=who))
    async with Client(served.fastmcp, mode="legacy") as legacy:  # no tasks: a call
        called = await legacy.call_tool("read", {"account": "acme"})
    async with Client(served.fastmcp) as client:
        task = await call_tool_task(client, "read", {"account": "acme"},
                                    raise_on_error=False)
        tasked: Any = await task.result()
    assert not called.is_error and not tasked.is_error, tasked.content
    assert RAN == ["read_ledger", "read_ledger"]
    assert seen[0] == ("ann", "ann-subject", "desk", frozenset({"billing.read"}),
                       {"team": "billing"})
    assert seen == [seen[0], seen[0]]


# A server that declares no step grant anywhere when the task is created: only the
# sub-flow's version registered while the task waits for approval asks for one.
@tool(safety=READ)
def plain_load(account: str) -> dict:
    RAN.append("plain_load")
    return {"account": account}


def grantless_server(authenticator: Any, refresh_caller: Any = None) -> FlowServer:
    RAN.clear()
    executor = FlowExecutor(FlowRegistry())
    for item in (plain_load, ship):
        executor.register_tool(item)
    register = executor.registry.register_flow
    register(Flow("inner", "d", [FlowStep("plain_load", id="inner_load")],
                  governance=FlowGovernance(publish=False)))
    register(Flow("shipping", "loads, then ships", [FlowStep(flow="inner"),
                                                   FlowStep("ship")]))
    return FlowServer(executor, tasks=TaskSettings(url="memory://", mode="optional"),
                      policy=ExposurePolicy(allowed_side_effects=["read", "write"],
                                            approval="elicit"),
                      security=SecurityConfig(authenticator=authenticator,
                                              refresh_caller=refresh_caller))


async def answered_after_a_grant_appears(flows: FlowServer) -> tuple[Any, Any]:
    """Create a task of ``shipping``, make ``inner``'s new version need ``billing.read``
    while the task waits for approval, approve it; (its last status, its result)."""
    async with answering(flows) as client:
        task = await call_tool_task(client, "shipping", {"account": "acme"},
                                    raise_on_error=False)
        requests = await waiting(task)
        flows.executor.registry.register_flow(Flow(
            "inner", "d", [FlowStep("plain_load", id="inner_load",
                                    requires=["billing.read"])],
            version="2.0.0", governance=FlowGovernance(publish=False)))
        status: Any = None
        for _ in range(2):  # the changed grant decisions may be asked about once more
            await update_task(task, reply(requests, "accept", {"approve": True}))
            asked = set(requests)

            async def moved_on(asked: set[str] = asked) -> Any:
                now = await task.status()
                if now.status == "input_required" and set(now.input_requests) != asked:
                    return now
                return now if now.status in ("completed", "failed") else None

            status = await until(moved_on, "the task to ask again or end", LIMIT)
            if status.status != "input_required":
                break
            requests = status.input_requests
        result = await task.result() if status.status == "completed" else None
    return status, result


async def test_a_grant_that_appears_later_is_judged_for_the_task_s_caller() -> None:
    # No grant anywhere at creation: the task's payload kept nothing of its caller, so
    # the answered leg judged the new grant for the token's caller (nobody, in memory),
    # not for "ann", who holds it; refresh_caller was asked about that other caller.
    asked: list[tuple[str, str | None]] = []

    def directory(caller: CallerIdentity) -> CallerIdentity:
        asked.append((caller.id, caller.subject))
        return caller

    def ann(gate: GateContext) -> CallerIdentity:
        return CallerIdentity("ann", {"team": "billing"}, subject="ann-subject",
                              scopes=frozenset({"billing.read"}))

    status, result = await answered_after_a_grant_appears(grantless_server(ann, directory))
    assert status.status == "completed", status
    assert not result.is_error, result.content
    assert RAN == ["plain_load", "ship"]
    assert asked and set(asked) == {("ann", "ann-subject")}


async def test_a_grant_that_appears_later_is_never_judged_for_the_token_s_caller() -> None:
    # The verified token names "app|olga"; the authenticator decides the caller is
    # "ann". Both hold billing.read when the task is answered, and the directory
    # (refresh_caller) has revoked ann's since: the leg must ask about ann and stop,
    # never judge the step for the token's caller (it ran as olga).
    from fastmcp.server.auth import AccessToken
    from mcp.server.auth.middleware.auth_context import auth_context_var
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

    asked: list[str] = []

    def directory(caller: CallerIdentity) -> CallerIdentity:
        asked.append(caller.id)
        if caller.id == "ann":
            return CallerIdentity(caller.id, caller.claims, scopes=frozenset())
        return caller

    def ann(gate: GateContext) -> CallerIdentity:
        return CallerIdentity("ann", {}, subject="ann", scopes=frozenset({"billing.read"}))

    token = AccessToken(token="tok-olga", client_id="app", scopes=["billing.read"],
                        claims={"sub": "olga"})
    reset = auth_context_var.set(AuthenticatedUser(token))  # as a verified HTTP request
    try:
        status, result = await answered_after_a_grant_appears(
            grantless_server(ann, directory))
    finally:
        auth_context_var.reset(reset)
    assert status.status == "completed", status
    assert result.is_error and "StepRefused" in result.content[0].text
    assert RAN == [] and set(asked) == {"ann"}
