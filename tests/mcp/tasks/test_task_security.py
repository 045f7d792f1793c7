"""Background tasks behind the security gate, an ``authenticator`` hook and per-caller
views, in memory: ``tasks/get``, ``tasks/cancel`` and ``tasks/update`` pass the gate,
answer only the caller that created the task, and only while the task's flow is in that
caller's view; anything else answers exactly like a task id that never existed.

Tasks exist only at protocol 2026-07-28 (the default client era); a 2025-11-25 client
cannot create or poll one (tests/mcp/tasks/test_tasks.py). The JWT case over streamable HTTP
is tests/e2e/test_task_security_http.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastmcp import Client
from fastmcp_tasks import ToolTask, call_tool_task
from mcp import MCPError
from servers import task_tools
from support.task_asks import send_task_update

from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    ExposurePolicy,
    FlowServer,
    GateContext,
    SecurityConfig,
    Visibility,
)
from chainweaver.mcp.tasks.extension import FlowTasksExtension

from .test_tasks import LIMIT, executor

pytestmark = pytest.mark.anyio
# The flows each caller's "flows" claim lists: sam and sid see the same ones.
SEES = {"sam": ["report", "quick"], "sid": ["report", "quick"], "olga": ["lookup_order"]}
NEVER = "A" * 43  # a well-formed task id that was never issued


class Switch:
    """An authenticator whose caller a test switches (None: nobody is authenticated)."""

    def __init__(self) -> None:
        self.who: str | None = "sam"

    def __call__(self, gate: GateContext) -> CallerIdentity | None:
        if self.who is None:
            return None
        return CallerIdentity(self.who, {"flows": SEES[self.who]}, subject=self.who)


def viewing(audit: list[AuditEvent] | None = None, **security: Any
            ) -> tuple[FlowServer, Switch]:
    switch = Switch()
    rule = Visibility(lambda caller, flow: flow.name in caller.claims.get("flows", []),
                      claims=("flows",))
    flow_server = FlowServer(
        executor(), tasks="memory://",
        policy=ExposurePolicy(allowed_side_effects=["read", "write"]),
        security=SecurityConfig(authenticator=switch,
                                audit_hook=audit.append if audit is not None else None,
                                visible=rule, **security))
    return flow_server, switch


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    task_tools.COUNTS.clear()
    task_tools.HOLD = None
    yield
    task_tools.HOLD = None


def handle(task: ToolTask, task_id: str) -> ToolTask:
    """The same client's handle on another task id."""
    created = task.create_result.model_copy(update={"task_id": task_id})
    return ToolTask(task._client, "report", created)


async def update(task: ToolTask) -> Any:
    return await send_task_update(task._client, task.task_id)


async def answer(call: Any) -> dict[str, Any] | str:
    """The JSON-RPC error a task request got, or what it answered instead."""
    try:
        value = await call
    except MCPError as error:
        return error.error.model_dump()
    return f"answered: {getattr(value, 'status', value)!r}"


async def as_never(task: ToolTask, call: Any) -> dict[str, Any]:
    """The error ``call`` gets for a task id that never existed, naming ``task``'s id."""
    never = await answer(call(handle(task, NEVER)))
    assert isinstance(never, dict) and never["code"] == -32602, never
    return {**never, "message": never["message"].replace(NEVER, task.task_id)}


async def started(task: ToolTask) -> None:
    for _ in range(int(LIMIT / 0.02)):
        if task_tools.COUNTS["enrich"]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the task never started")


async def test_the_owner_reads_its_completed_task_under_an_authenticator_view() -> None:
    flow_server, _ = viewing()
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        result = await asyncio.wait_for(task.result(), LIMIT)
    assert result.structured_content == {"n": 21}


@pytest.mark.parametrize("who", ["olga", "sid"])  # outside the view / the same view
@pytest.mark.parametrize("method", ["get", "cancel", "update"])
async def test_another_callers_task_is_a_task_that_never_existed(who: str, method: str
                                                                 ) -> None:
    calls = {"get": ToolTask.status, "cancel": ToolTask.cancel, "update": update}
    call = calls[method]
    task_tools.HOLD = asyncio.Event()
    flow_server, switch = viewing()
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        switch.who = who
        theirs = await answer(call(task))
        never = await as_never(task, call)
        switch.who = "sam"
        status = (await task.status()).status
        task_tools.HOLD.set()
        result = await asyncio.wait_for(task.result(), LIMIT)
    assert theirs == never
    assert status == "working"  # not cancelled by anyone else
    assert result.structured_content == {"n": 21}


async def test_task_requests_pass_the_gate_and_are_audited_as_the_caller() -> None:
    audit: list[AuditEvent] = []
    flow_server, switch = viewing(audit)
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        await asyncio.wait_for(task.result(), LIMIT)
        switch.who = None  # the authenticator refuses everyone now
        refused = await answer(task.status())
    assert isinstance(refused, dict) and refused["code"] == GATE_REFUSED
    assert refused["data"] == {"reason": "unauthenticated"}
    requests = [e for e in audit if e.kind == "task" and e.name == "tasks/get"]
    allowed = [e for e in requests if e.decision == "allowed"]
    assert {(e.caller_id, e.task_id) for e in allowed} == {("sam", task.task_id)}
    assert {e.phase for e in allowed} == {"decision", "completed"}
    (denied,) = [e for e in requests if e.decision == "denied"]
    assert (denied.reason, denied.caller_id, denied.task_id) == (
        "unauthenticated", None, task.task_id)


async def test_task_requests_are_rate_limited() -> None:
    class NoPolling:
        def acquire(self, caller: CallerIdentity, name: str) -> bool:
            return name != "tasks/get"

    flow_server, _ = viewing(rate_limiter=NoPolling())
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        limited = await answer(task.status())
    assert isinstance(limited, dict) and limited["code"] == GATE_REFUSED
    assert limited["data"] == {"reason": "rate_limited"}


async def test_the_task_audit_names_the_gates_caller() -> None:
    audit: list[AuditEvent] = []
    flow_server, _ = viewing(audit)
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        await asyncio.wait_for(task.result(), LIMIT)
    states = [e for e in audit if e.kind == "task" and e.task_status]
    assert [(e.phase, e.task_status) for e in states] == [
        ("decision", "working"), ("state", "working"), ("completed", "completed")]
    assert {e.caller_id for e in audit} == {"sam"}


@pytest.mark.parametrize("leaves", ["archived", "unregistered", "outside the view"])
async def test_a_task_whose_flow_left_the_view_is_a_task_that_never_existed(leaves: str
                                                                            ) -> None:
    flow_server, switch = viewing()
    registry = flow_server.executor.registry
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        await asyncio.wait_for(task.result(), LIMIT)
        if leaves == "archived":
            registry.set_lifecycle("report", "archived")
        elif leaves == "unregistered":
            registry.unregister("report")
        else:
            SEES["sam"] = ["quick"]
        try:
            after = {method: await answer(call(task)) for method, call in
                     (("get", ToolTask.status), ("cancel", ToolTask.cancel),
                      ("update", update))}
            never = {"get": await as_never(task, ToolTask.status),
                     "cancel": await as_never(task, ToolTask.cancel),
                     "update": await as_never(task, update)}
        finally:
            SEES["sam"] = ["report", "quick"]
    assert after == never


async def test_a_run_whose_flow_is_retired_finishes_but_is_no_longer_served() -> None:
    task_tools.HOLD = asyncio.Event()
    flow_server, _ = viewing()
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        await started(task)
        flow_server.executor.registry.set_lifecycle("report", "archived")
        task_tools.HOLD.set()
        for _ in range(int(LIMIT / 0.02)):
            if task_tools.COUNTS["finish"]:
                break
            await asyncio.sleep(0.02)
        final = await answer(task.status())
        never = await as_never(task, ToolTask.status)
    assert task_tools.COUNTS["finish"] == 1  # the run went on to its last step
    assert final == never


def test_the_tasks_extension_check_used_for_task_requests_still_exists() -> None:
    # FlowTasksExtension._owned runs fastmcp-tasks' own request checks before the
    # owner check: fail loudly when fastmcp-tasks renames them.
    assert callable(getattr(FlowTasksExtension, "_check_task_request", None))
