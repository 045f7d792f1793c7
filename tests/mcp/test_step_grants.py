"""Step grants through a real MCP client: every step of a called flow is checked against
the caller before it runs, a refusal is an isError result naming only what the caller
may see, and the audit holds the call's decision, each step decision and the refusal.
Both protocol eras; standalone, mounted and namespaced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.dependencies import get_context
from pydantic import BaseModel

from chainweaver import (
    Delegation,
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    StepDecision,
    StepRequest,
    ToolSafetyContract,
    tool,
)
from chainweaver.errors import ExposureConfigError
from chainweaver.mcp import AuditEvent, CallerIdentity, FlowServer, GateContext, SecurityConfig

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
READ = ToolSafetyContract("read")
RAN: list[str] = []
HIDDEN = FlowGovernance(publish=False)  # runs as a sub-flow, never published


class Invoice(BaseModel):
    tenant: str
    cents: int = 0


@tool(safety=READ)
def open_invoice(tenant: str) -> Invoice:
    RAN.append("open_invoice")
    return Invoice(tenant=tenant, cents=100)


@tool(safety=READ, requires=["billing.read"])
def read_ledger(invoice: Invoice) -> Invoice:
    RAN.append(f"read_ledger:{invoice.tenant}")
    return invoice


@tool(safety=READ, requires={"scopes": ["billing.admin"]})
def export_ledger(invoice: Invoice) -> Invoice:
    RAN.append("export_ledger")
    return invoice


@tool(safety=READ)
def broken(invoice: Invoice) -> Invoice:
    RAN.append("broken")
    raise RuntimeError("down")


class Who:
    """An authenticator the test switches: scopes and a tenant claim per caller."""

    SCOPES = {"ann": {"billing.read"}, "root": {"billing.read", "billing.admin"},
              "guest": set()}

    def __init__(self) -> None:
        self.who = "ann"

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who, {"tenant": self.who}, subject=self.who,
                              scopes=frozenset(self.SCOPES[self.who]))


# Scopes withdrawn since each caller's token was issued (the directory's word now): the
# token still says them, so the flow stays in the caller's view, but the run asks
# refresh_caller before each step and is refused where the grant is needed.
REVOKED: dict[str, set[str]] = {}


def refresh(caller: CallerIdentity) -> CallerIdentity:
    gone = REVOKED.get(caller.id, set())
    return CallerIdentity(caller.id, caller.claims, subject=caller.subject,
                          scopes=caller.scopes - gone)


def billing(**security: Any) -> tuple[FlowServer, Who, list[AuditEvent]]:
    RAN.clear()
    REVOKED.clear()
    executor = FlowExecutor(FlowRegistry())
    for item in (open_invoice, read_ledger, export_ledger, broken):
        executor.register_tool(item)
    register = executor.registry.register_flow
    register(Flow("ledger", "reads the ledger", [FlowStep("read_ledger")],
                  governance=HIDDEN))
    register(Flow("exporter", "exports", [FlowStep("export_ledger")],
                  governance=HIDDEN))
    register(Flow("archive", "exports through a sub-flow", [FlowStep(flow="exporter")],
                  governance=HIDDEN))
    register(Flow("invoice", "reads an invoice", [FlowStep("open_invoice"),
                                                   FlowStep("read_ledger")]))
    register(Flow("deep_invoice", "exports two levels down", [
        FlowStep("open_invoice"), FlowStep(flow="ledger"), FlowStep(flow="archive")]))
    register(Flow("risky_invoice", "falls back to an export", [
        FlowStep("open_invoice"),
        FlowStep("broken", on_error="fallback", fallback="export_ledger")]))
    register(Flow("service_invoice", "exports as the service", [
        FlowStep("open_invoice"), FlowStep("export_ledger")],
        delegations=[Delegation("export_ledger", "nightly export runs as billing")]))
    events: list[AuditEvent] = []
    who = Who()
    security.setdefault("authenticator", who)
    security.setdefault("refresh_caller", refresh)
    server = FlowServer(executor, security=SecurityConfig(audit_hook=events.append,
                                                          **security))
    return server, who, events


def text(result: Any) -> str:
    return " ".join(c.text for c in result.content)


@pytest.mark.parametrize("mode", ERAS)
async def test_a_child_tool_the_caller_may_not_use_is_refused_before_it_runs(mode: str
                                                                            ) -> None:
    server, who, events = billing()
    REVOKED["ann"] = {"billing.read"}
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("invoice", {"tenant": "ann"}, raise_on_error=False)
    assert result.is_error and RAN == ["open_invoice"]
    assert text(result).startswith("StepRefused: step 1 ('read_ledger') was refused")
    assert "missing_grant" in text(result)
    steps = result.meta["chainweaver"]["steps"]
    assert [(s["id"], s["status"]) for s in steps] == [("open_invoice", "completed"),
                                                       ("read_ledger", "failed")]
    step = [e for e in events if e.phase == "step"]
    assert [(e.decision, e.reason, e.step_id, e.caller_id) for e in step] == [
        ("denied", "missing_grant", "read_ledger", "ann")]
    (done,) = [e for e in events if e.phase == "completed" and e.kind == "tool"]
    assert done.outcome == "error" and done.error_type == "StepRefused"
    assert done.steps is not None and done.steps["denied"] == 1


@pytest.mark.parametrize("mode", ERAS)
async def test_the_audit_holds_the_macro_and_each_child_decision(mode: str) -> None:
    server, who, events = billing()
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("invoice", {"tenant": "ann"})
    assert not result.is_error and RAN == ["open_invoice", "read_ledger:ann"]
    decision = [e for e in events if e.phase == "decision" and e.kind == "tool"]
    assert [(e.flow_name, e.decision, e.caller_id) for e in decision] == [
        ("invoice", "allowed", "ann")]
    (done,) = [e for e in events if e.phase == "completed" and e.kind == "tool"]
    assert done.steps is not None
    assert [(s["path"], s["target"], s["decision"], s["grant"]) for s in done.steps["steps"]
            ] == [("open_invoice", "open_invoice", "allowed", "caller"),
                  ("read_ledger", "read_ledger", "allowed", "caller")]
    assert done.steps["refused"] is None


@pytest.mark.parametrize("mode", ERAS)
async def test_the_same_tool_on_another_tenant_is_refused_by_its_arguments(mode: str
                                                                          ) -> None:
    def own_tenant(request: StepRequest) -> StepDecision:
        if request.target != "read_ledger":
            return StepDecision(True)
        return StepDecision(request.arguments["tenant"] == request.caller.claims["tenant"],
                            "other_tenant")

    server, _, events = billing(step_authorizer=own_tenant)
    async with Client(server.fastmcp, mode=mode) as client:
        mine = await client.call_tool("invoice", {"tenant": "ann"})
        theirs = await client.call_tool("invoice", {"tenant": "bob"}, raise_on_error=False)
    assert not mine.is_error and theirs.is_error
    assert "other_tenant" in text(theirs)
    assert RAN == ["open_invoice", "read_ledger:ann", "open_invoice"]
    assert [e.reason for e in events if e.phase == "step"] == ["other_tenant"]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_privileged_hidden_sub_flow_two_levels_down_is_named_by_its_index(
        mode: str) -> None:
    server, who, events = billing()
    who.who = "root"
    REVOKED["root"] = {"billing.admin"}
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("deep_invoice", {"tenant": "root"},
                                        raise_on_error=False)
    assert result.is_error
    assert text(result) == "StepRefused: step 'subflow#2' failed"
    for hidden in ("archive", "exporter", "export_ledger"):
        assert hidden not in text(result) and hidden not in str(result.meta)
    assert "export_ledger" not in RAN and "read_ledger:root" in RAN
    # The operator's audit names the real path.
    assert [e.step_id for e in events if e.phase == "step"] == ["archive/exporter/export_ledger"]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_fallback_stronger_than_its_step_is_refused(mode: str) -> None:
    server, who, _ = billing()
    who.who = "root"
    REVOKED["root"] = {"billing.admin"}
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("risky_invoice", {"tenant": "root"},
                                        raise_on_error=False)
        assert result.is_error and "StepRefused" in text(result)
        assert "export_ledger" not in RAN and "broken" in RAN
        REVOKED.clear()
        allowed = await client.call_tool("risky_invoice", {"tenant": "root"})
    assert allowed.meta["chainweaver"]["steps"][1]["fallback"] == "export_ledger"


@pytest.mark.parametrize("mode", ERAS)
async def test_a_declared_delegation_runs_and_is_audited_as_one(mode: str) -> None:
    server, _, events = billing()
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("service_invoice", {"tenant": "ann"})
    assert not result.is_error and "export_ledger" in RAN
    (done,) = [e for e in events if e.phase == "completed" and e.kind == "tool"]
    assert done.steps is not None and done.steps["delegated"] == 1
    assert done.steps["steps"][1]["grant"] == "delegation"


@pytest.mark.parametrize("mode", ERAS)
async def test_a_revoked_caller_is_refused_at_the_next_step(mode: str) -> None:
    revoked: set[str] = set()

    def refresh(caller: CallerIdentity) -> CallerIdentity | None:
        if caller.id in revoked:
            return CallerIdentity(caller.id, caller.claims, scopes=frozenset())
        return caller

    @tool(safety=READ)
    def revoke(invoice: Invoice) -> Invoice:
        revoked.add("ann")  # the caller's grant goes while the run is under way
        return invoice

    server, _, events = billing(refresh_caller=refresh)
    server.executor.register_tool(revoke)
    server.executor.registry.register_flow(Flow("revoking", "d", [
        FlowStep("open_invoice"), FlowStep("revoke"), FlowStep("read_ledger")]))
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("revoking", {"tenant": "ann"}, raise_on_error=False)
    assert result.is_error and "read_ledger:ann" not in RAN
    assert [e.step_id for e in events if e.phase == "step"] == ["read_ledger"]


@pytest.mark.parametrize("namespace", [None, "acct"])
@pytest.mark.parametrize("mode", ERAS)
async def test_mounted_and_namespaced_servers_check_every_step(mode: str,
                                                              namespace: str | None) -> None:
    server, who, events = billing()
    REVOKED["ann"] = {"billing.read"}
    parent = FastMCP("parent")
    server.mount_into(parent, namespace=namespace)
    name = "invoice" if namespace is None else f"{namespace}_invoice"
    async with Client(parent, mode=mode) as client:
        assert name in {t.name for t in await client.list_tools()}
        result = await client.call_tool(name, {"tenant": "ann"}, raise_on_error=False)
    assert result.is_error and "StepRefused" in text(result)
    assert RAN == ["open_invoice"]
    assert [e.reason for e in events if e.phase == "step"] == ["missing_grant"]


async def test_a_server_without_grants_or_hook_builds_no_guard() -> None:
    server, _, _ = billing()
    plain = server._provider.flow_tool(server._provider.exposure.current.tool("invoice"))
    assert plain._step_guard() is not None  # read_ledger declares a grant
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(open_invoice)
    executor.registry.register_flow(Flow("plain", "d", [FlowStep("open_invoice")]))
    bare = FlowServer(executor)
    tool_ = bare._provider.flow_tool(bare._provider.exposure.current.tool("plain"))
    assert tool_._step_guard() is None


@pytest.mark.parametrize("mode", ERAS)
async def test_an_executor_s_own_step_authorizer_is_asked_through_the_server(mode: str
                                                                            ) -> None:
    # FlowExecutor(step_authorizer=...) served as it is: asked before every step of a
    # call, with the caller the gate admitted (it was skipped for flows declaring
    # grants, and refused every step of the others for want of a caller).
    def own_tenant(request: StepRequest) -> StepDecision:
        tenant = request.arguments.get("tenant", request.caller.claims["tenant"])
        return StepDecision(tenant == request.caller.claims["tenant"], "other_tenant")

    RAN.clear()
    executor = FlowExecutor(FlowRegistry(), step_authorizer=own_tenant)
    for item in (open_invoice, read_ledger):
        executor.register_tool(item)
    executor.registry.register_flow(Flow("open", "opens", [FlowStep("open_invoice")]))
    executor.registry.register_flow(Flow("invoice", "reads", [FlowStep("open_invoice"),
                                                              FlowStep("read_ledger")]))
    server = FlowServer(executor, security=SecurityConfig(authenticator=Who()))
    async with Client(server.fastmcp, mode=mode) as client:
        for name in ("open", "invoice"):
            assert not (await client.call_tool(name, {"tenant": "ann"})).is_error
            theirs = await client.call_tool(name, {"tenant": "bob"}, raise_on_error=False)
            assert theirs.is_error and "other_tenant" in text(theirs)
    assert RAN == ["open_invoice", "open_invoice", "read_ledger:ann"]


def test_a_step_authorizer_set_on_both_the_executor_and_the_server_is_refused() -> None:
    def one(request: StepRequest) -> bool:
        return True

    def other(request: StepRequest) -> bool:
        return True

    executor = FlowExecutor(FlowRegistry(), step_authorizer=one)
    with pytest.raises(ExposureConfigError, match="both"):
        FlowServer(executor, security=SecurityConfig(step_authorizer=other))
    FlowServer(executor, security=SecurityConfig(step_authorizer=one))  # the same hook


class LoopBound:
    """Async hooks made on the server's event loop, as an async database or HTTP
    client is: used from another loop they fail, as such a client would, and they read
    the request they serve through FastMCP's context."""

    def __init__(self) -> None:
        self.loop: Any = None
        self.asked: list[str] = []

    def check(self, what: str) -> None:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("attached to a different event loop")
        get_context()  # the request being served (raises outside one)
        self.asked.append(what)

    async def refresh(self, caller: CallerIdentity) -> CallerIdentity:
        await asyncio.sleep(0)
        self.check("refresh")
        return caller

    async def authorize(self, request: StepRequest) -> bool:
        await asyncio.sleep(0)
        self.check(request.path)
        return True


@pytest.mark.parametrize("mode", ERAS)
async def test_async_hooks_run_on_the_server_s_loop_in_the_request_s_context(mode: str
                                                                           ) -> None:
    # invoice's tools are plain sync functions: the async lane runs them in worker
    # threads, and the checks before them were answered there, each async hook on a
    # private event loop outside the request (so both failed, and every step was
    # refused).
    hooks = LoopBound()
    server, _, events = billing(refresh_caller=hooks.refresh,
                                step_authorizer=hooks.authorize)
    hooks.loop = asyncio.get_running_loop()  # the in-memory server runs on this loop
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("invoice", {"tenant": "ann"}, raise_on_error=False)
    assert not result.is_error, text(result)
    assert RAN == ["open_invoice", "read_ledger:ann"]
    assert hooks.asked == ["refresh", "open_invoice", "refresh", "read_ledger"]
    assert [e for e in events if e.phase == "step"] == []
