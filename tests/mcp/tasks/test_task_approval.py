"""Approval inside a background task, in memory: a flow that asks for approval turns
its task ``input_required`` before any step runs; ``tasks/update`` carries the user's
answer and the task goes on (or ends refused), answered only by the task's caller.

Tasks exist only at protocol 2026-07-28; a 2025-11-25 client calling the same flow is
asked through elicitation, inside its call (the last tests). Across processes (the
answer reaching another replica, the next leg another worker): tests/e2e/test_tasks_redis.py.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from fastmcp import Client
from fastmcp_tasks import ToolTask, call_tool_task
from fastmcp_tasks.input_store import load_current_leg
from mcp import MCPError
from support.polling import until
from support.task_asks import answering, reply, update_task, waiting

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep
from chainweaver.mcp import (
    AuditEvent,
    CallerIdentity,
    ExposurePolicy,
    FlowServer,
    GateContext,
    SecurityConfig,
)
from chainweaver.mcp.fastmcp_seams import running_docket
from chainweaver.mcp.runs.approval import APPROVAL_SCHEMA
from chainweaver.mcp.tasks.runner import RUNNER_NAME

from ..runs.test_runs import CHARGED, ORDER, SECRET, Seen, charge, summarize, validate

pytestmark = pytest.mark.anyio
LIMIT = 10.0  # seconds: only to stop a hang
CHARGED_ORDER = {"card": SECRET, "cents": 100, "stage": 1}


class Switch:
    """An authenticator whose caller a test switches."""

    def __init__(self) -> None:
        self.who = "sam"

    def __call__(self, gate: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who, subject=self.who)


def paying(audit: list[AuditEvent] | None = None) -> tuple[FlowServer, Switch]:
    """``pay`` (optional task mode) and ``pay_later`` (required) both ask for approval."""
    CHARGED.clear()
    executor = FlowExecutor(FlowRegistry())
    for tool in (validate, charge, summarize):
        executor.register_tool(tool)
    executor.registry.register_flow(
        Flow("pay", "charges a card", [FlowStep("validate"), FlowStep("charge")]))
    executor.registry.register_flow(
        Flow("pay_later", "charges a card, in the background",
             [FlowStep("validate"), FlowStep("charge")], task_mode="required"))
    switch = Switch()
    server = FlowServer(executor, tasks="memory://",
                        policy=ExposurePolicy(allowed_side_effects=["read", "write"],
                                              approval="elicit"),
                        security=SecurityConfig(authenticator=switch, audit_hook=(
                            audit.append if audit is not None else None)))
    return server, switch










async def leg(server: FlowServer, task: ToolTask) -> int:
    """The task's current leg (1: the first run; each answer that re-enters adds one).
    ``tasks/update`` advances it before it answers, so a re-entry shows at once."""
    docket = running_docket(server.fastmcp)
    assert docket is not None
    return (await load_current_leg(docket, None, task.task_id))[1]  # no token: no scope




async def test_an_approval_turns_the_task_input_required_before_any_step() -> None:
    audit: list[AuditEvent] = []
    server, _ = paying(audit)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER)
        requests = await waiting(task)
        assert CHARGED == []  # nothing ran: the ask comes before the first step
        (ask,) = requests.values()
        assert ask["method"] == "elicitation/create"
        assert ask["params"]["requestedSchema"] == APPROVAL_SCHEMA
        for part in ("'pay'", "'charge'", "'write'", "charges a card"):
            assert part in ask["params"]["message"]
        assert SECRET not in str(ask)  # argument values are never shown
        await update_task(task, reply(requests, "accept", {"approve": True}))
        done = await task.wait(timeout=LIMIT)
        result = await task.result()
    assert done.status == "completed"
    assert result.structured_content == CHARGED_ORDER and CHARGED == [100]
    states = [(e.phase, e.task_status, e.reason, e.step_id) for e in audit
              if e.kind == "task" and e.task_status]
    assert states == [
        ("decision", "working", "created", None),
        ("state", "working", "ok", None),  # the first leg starts
        ("state", "input_required", "ok", None),  # and asks
        ("state", "working", "ok", None),  # the answered leg starts
        ("approval", "working", "accept", "charge"),
        ("completed", "completed", "ok", None)]
    assert {e.caller_id for e in audit if e.kind == "task"} == {"sam"}
    (approval,) = [e for e in audit if e.phase == "approval"]
    assert (approval.decision, approval.task_id, approval.flow_name) == (
        "allowed", task.task_id, "pay")


@pytest.mark.parametrize(("action", "content", "answer"), [
    ("accept", {"approve": False}, "decline"),
    ("accept", {"approve": "maybe"}, "decline"),
    ("decline", None, "decline"),
    ("cancel", None, "cancel"),
])
async def test_a_refused_approval_completes_the_task_with_an_error_and_no_side_effect(
        action: str, content: Any, answer: str) -> None:
    audit: list[AuditEvent] = []
    server, _ = paying(audit)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        await update_task(task, reply(await waiting(task), action, content))
        done = await task.wait(timeout=LIMIT)
        result = await task.result()
    assert done.status == "completed"  # a refused run is a result, not a failed task
    assert result.is_error and CHARGED == []
    assert result.content[0].text.startswith("ApprovalDenied: ")
    assert result.content[0].text.endswith(f"(answer: {answer})")
    (approval,) = [e for e in audit if e.phase == "approval"]
    assert (approval.decision, approval.reason, approval.kind) == ("denied", answer, "task")


async def test_the_client_answers_through_its_elicitation_handler() -> None:
    server, _ = paying()
    seen = Seen({"approve": True})
    async with seen.client(server, "auto") as client:
        handled = await asyncio.wait_for((await call_tool_task(client, "pay", ORDER)).result(),
                                         LIMIT)
        # A plain call_tool opts in to tasks too, and is driven to its result.
        plain = await asyncio.wait_for(client.call_tool("pay_later", ORDER), LIMIT)
    assert handled.structured_content == plain.structured_content == CHARGED_ORDER
    assert CHARGED == [100, 100] and len(seen.asked) == 2
    assert "'pay_later'" in seen.asked[1]


async def test_answers_to_nothing_asked_leave_the_task_waiting() -> None:
    server, _ = paying()
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER)
        requests = await waiting(task)
        await update_task(task, {"not-a-request": {"action": "accept",
                                              "content": {"approve": True}}})
        await update_task(task, {})
        still = await task.status()
        assert still.status == "input_required" and still.input_requests == requests
        await update_task(task, reply(requests, "accept", {"approve": True}))
        await task.wait(timeout=LIMIT)
        assert await leg(server, task) == 2
        await update_task(task, reply(requests, "accept", {"approve": True}))  # answered once
        assert await leg(server, task) == 2  # no leg was enqueued again
    assert CHARGED == [100]


async def test_cancelling_a_waiting_task_ends_it_and_is_audited() -> None:
    audit: list[AuditEvent] = []
    server, _ = paying(audit)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER)
        requests = await waiting(task)
        await task.cancel()
        await update_task(task, reply(requests, "accept", {"approve": True}))  # too late
        assert await leg(server, task) == 1  # the answer enqueued nothing
        status = await task.status()
    assert status.status == "cancelled" and CHARGED == []
    assert [(e.phase, e.task_status) for e in audit if e.kind == "task" and e.task_status
            ][-2:] == [("state", "input_required"), ("state", "cancelled")]


@pytest.mark.slow  # waits out a (shortened) TTL
async def test_an_ask_left_unanswered_expires_with_the_task() -> None:
    # The ask is a finished leg: Docket keeps it for its execution TTL (15 minutes by
    # default, shortened here), then the task is gone, with no step run.
    server, _ = paying()
    async with answering(server) as client:
        docket = running_docket(server.fastmcp)
        assert docket is not None
        # What docs/tasks.md promises (fastmcp-tasks builds its Docket with the default).
        assert docket.execution_ttl == timedelta(minutes=15)
        docket.execution_ttl = timedelta(seconds=1)
        task = await call_tool_task(client, "pay", ORDER)
        requests = await waiting(task)

        async def expired() -> bool:
            try:
                await task.status()
            except MCPError:
                return True
            return False

        await until(expired, "the unanswered task to expire", 30.0, poll=0.1)
        with pytest.raises(MCPError) as gone:
            await task.status()
        with pytest.raises(MCPError) as late:
            await update_task(task, reply(requests, "accept", {"approve": True}))
    assert gone.value.error.message == late.value.error.message == \
        f"Task {task.task_id} not found"
    assert CHARGED == []


async def test_only_the_tasks_caller_can_answer_it() -> None:
    server, switch = paying()
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER)
        requests = await waiting(task)
        switch.who = "mallory"
        with pytest.raises(MCPError) as theirs:
            await update_task(task, reply(requests, "accept", {"approve": True}))
        with pytest.raises(MCPError) as never:
            await update_task(ToolTask(client, "pay", task.create_result.model_copy(
                update={"task_id": "A" * 43})), {})
        switch.who = "sam"
        assert (await task.status()).status == "input_required"
        assert CHARGED == []
        await update_task(task, reply(requests, "accept", {"approve": True}))
        done = await task.wait(timeout=LIMIT)
    assert theirs.value.error.code == never.value.error.code == -32602
    assert theirs.value.error.message == f"Task {task.task_id} not found"
    assert never.value.error.message == f"Task {'A' * 43} not found"
    assert done.status == "completed" and CHARGED == [100]


async def test_a_required_task_flow_that_asks_for_approval_is_published() -> None:
    server, _ = paying()
    (report,) = [r for r in server.exposure_report() if r.flow_name == "pay_later"]
    assert report.exposed and report.needs_approval
    async with answering(server) as client:
        tools = {t.name: t for t in await client.list_tools()}
    assert tools["pay_later"].meta["chainweaver"]["task_mode"] == "required"
    assert tools["pay"].meta["chainweaver"]["task_mode"] == "optional"


async def test_a_legacy_client_is_asked_inside_its_call() -> None:
    """2025-11-25 has no tasks: the same flow asks through elicitation, in the call."""
    server, _ = paying()
    seen = Seen({"approve": True})
    async with seen.client(server, "legacy") as client:
        result = await asyncio.wait_for(client.call_tool("pay", ORDER), LIMIT)
        with pytest.raises(MCPError) as required:
            await client.call_tool("pay_later", ORDER)
    assert result.structured_content == CHARGED_ORDER and CHARGED == [100]
    assert len(seen.asked) == 1
    assert required.value.error.code == -32021


async def test_the_runner_stays_unreachable_after_serving_a_result() -> None:
    # tasks/get resolves the runner by name to build a finished task's result; no
    # request after (or beside) it may find it.
    server, _ = paying()
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER)
        await update_task(task, reply(await waiting(task), "accept", {"approve": True}))
        await task.result()
        assert RUNNER_NAME not in {t.name for t in await client.list_tools()}
        runner = await client.call_tool(RUNNER_NAME, {}, raise_on_error=False)
        never = await client.call_tool("never_existed", {}, raise_on_error=False)
    assert runner.is_error and runner.content[0].text.replace(RUNNER_NAME, "X") == \
        never.content[0].text.replace("never_existed", "X")
    assert await server.fastmcp.get_tool(RUNNER_NAME) is None


async def test_a_client_that_cannot_answer_gets_the_refusal_at_once() -> None:
    """A client that declared no elicitation could never answer: its task does not
    wait 15 minutes for it, it completes refused, as a call would."""
    audit: list[AuditEvent] = []
    server, _ = paying(audit)
    async with Client(server.fastmcp) as client:  # no elicitation handler
        task = await call_tool_task(client, "pay_later", ORDER, raise_on_error=False)
        done = await task.wait(timeout=LIMIT)
        result = await task.result()
    assert done.status == "completed" and result.is_error and CHARGED == []
    assert result.content[0].text.endswith("(answer: unavailable)")
    (approval,) = [e for e in audit if e.phase == "approval"]
    assert (approval.decision, approval.reason, approval.kind) == (
        "denied", "unavailable", "task")


async def test_a_leg_that_only_asks_is_not_marked_as_a_run() -> None:
    # The mark is how a redelivered run of a non-idempotent flow knows it may have had
    # side effects; the asking leg has none, so a worker dying there loses nothing.
    server, _ = paying()

    async def marks() -> int:
        docket = running_docket(server.fastmcp)
        async with docket.redis() as redis:
            return len([key async for key in redis.scan_iter(match="*chainweaver:task-run:*")])

    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER)
        requests = await waiting(task)
        asked = await marks()
        await update_task(task, reply(requests, "accept", {"approve": True}))
        await task.wait(timeout=LIMIT)
        ran = await marks()
    assert (asked, ran) == (0, 1) and CHARGED == [100]
