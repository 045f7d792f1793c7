"""A worker that fails a task without running it (its exposure does not publish the
flow version; it asks no approval where the task's creator did; it lacks a step hook
the creator asks) audits the refusal, like every other task transition: one
``phase="state"`` record, ``task_status="failed"``, ``decision="denied"`` and a reason
code. In memory: an enqueue-only replica and a worker share a named queue."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastmcp import Client
from fastmcp_tasks import call_tool_task
from support.polling import until

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
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
LIMIT = 10.0  # seconds: only to stop a hang
RAN: list[str] = []


@tool(safety=ToolSafetyContract("write", requires_approval=True, approval_reason="ships"))
def ship(order: str) -> dict:
    RAN.append(order)
    return {"shipped": order}


def ann(gate: GateContext) -> CallerIdentity:
    return CallerIdentity("ann")


def flow_server(queue: str, *, version: str = "1.0.0", concurrency: int | None = None,
                approval: bool = True, refresh: bool = False,
                audit: list[AuditEvent] | None = None) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(ship)
    executor.registry.register_flow(Flow("shipping", "ships an order", [FlowStep("ship")],
                                         version=version))
    policy = ExposurePolicy(allowed_side_effects=["read", "write"],
                            allow_requires_approval=True,
                            approval="elicit" if approval else "exclude")
    security = SecurityConfig(authenticator=ann,
                              refresh_caller=(lambda caller: caller) if refresh else None,
                              audit_hook=audit.append if audit is not None else None)
    return FlowServer(executor, policy=policy, security=security,
                      tasks=TaskSettings(url="memory://", name=queue,
                                         concurrency=concurrency))


async def no_answer(*_: Any) -> Any:
    return {"approve": False}


@pytest.mark.parametrize(("worker", "reason", "message"), [
    ({"version": "2.0.0"}, "flow_unavailable", "is no longer published here"),
    ({"approval": False}, "approval_not_configured", "but not on this worker"),
    ({"refresh": True}, "step_checks_not_configured",
     "checked by refresh_caller where the task was created"),
])
async def test_a_worker_that_fails_a_task_unrun_audits_it(worker: dict[str, Any],
                                                         reason: str, message: str) -> None:
    RAN.clear()
    worker = dict(worker)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    audit: list[AuditEvent] = []
    # The replica asks for approval, and the third one asks refresh_caller: the worker
    # of each case lacks one thing the replica has.
    replica = flow_server(queue, concurrency=0, refresh=worker.pop("refresh", False))
    running = flow_server(queue, audit=audit, **worker)
    async with Client(running.fastmcp), \
            Client(replica.fastmcp, elicitation_handler=no_answer) as client:
        task = await call_tool_task(client, "shipping", {"order": "A-1"},
                                    raise_on_error=False)

        async def ended() -> Any:
            status = await task.status()
            return status if status.status in ("failed", "completed") else None

        status = await until(ended, "the worker to fail the task", LIMIT)
    assert status.status == "failed" and message in (status.status_message or "")
    assert RAN == []
    records = [(e.phase, e.kind, e.name, e.flow_version, e.caller_id, e.task_status,
                e.decision, e.reason) for e in audit if e.task_id == task.task_id]
    assert records == [("state", "task", "shipping", "1.0.0", "ann", "failed", "denied",
                        reason)]
