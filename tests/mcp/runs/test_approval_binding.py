"""An approval is single-use and bound to the caller, the flow, its version, the steps and
the arguments (2026-07-28); and a run that waited for an approval is admitted again,
against the current snapshot and the caller's current view, before any step runs (both
eras, and in a background task).

The side-effecting tool counts its runs: a refused approval must leave it at zero."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fastmcp import Client
from mcp import MCPError
from support.mcp_client import raw_call

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep
from chainweaver.mcp import (
    AuditEvent,
    CallerIdentity,
    ExposurePolicy,
    FlowServer,
    GateContext,
    SecurityConfig,
)
from chainweaver.mcp.runs.approval import APPROVAL_KEY

from .test_runs import CHARGED, ORDER, charge, validate

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
ACCEPT = {APPROVAL_KEY: {"action": "accept", "content": {"approve": True}}}
LIMIT = 10.0


class Switch:
    """An authenticator hook whose caller the test switches (no OAuth token at all:
    the SDK's own request-state binding has no principal to bind to)."""

    def __init__(self) -> None:
        self.who = "sam"

    def __call__(self, gate: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who, {"teams": [self.who]}, subject=self.who)


def paying(*, visible: Any = None, tasks: bool = False
           ) -> tuple[FlowServer, Switch, list[AuditEvent]]:
    CHARGED.clear()
    executor = FlowExecutor(FlowRegistry())
    for tool in (validate, charge):
        executor.register_tool(tool)
    executor.registry.register_flow(
        Flow("pay", "charges a card", [FlowStep("validate"), FlowStep("charge")]))
    executor.registry.register_flow(
        Flow("pay_inline", "charges a card, never as a task",
             [FlowStep("validate"), FlowStep("charge")], task_mode="forbidden"))
    switch = Switch()
    audit: list[AuditEvent] = []
    options: dict[str, Any] = {"tasks": "memory://"} if tasks else {}
    server = FlowServer(executor,
                        policy=ExposurePolicy(allowed_side_effects=["read", "write"],
                                              approval="elicit"),
                        security=SecurityConfig(authenticator=switch, audit_hook=audit.append,
                                                visible=visible),
                        **options)
    return server, switch, audit


async def _ask(client: Client, arguments: dict[str, Any] = ORDER, name: str = "pay") -> str:
    first = await raw_call(client, {"name": name, "arguments": arguments})
    assert first["resultType"] == "input_required" and CHARGED == []
    return first["requestState"]


def _approvals(audit: list[AuditEvent]) -> list[tuple[str | None, str]]:
    return [(e.caller_id, e.reason) for e in audit if e.phase == "approval"]


async def _noop(*_: Any) -> Any:
    raise AssertionError("asked on the wire: answered by hand")


# ------------------------------------------------------------------ single use


async def test_a_replayed_approval_runs_nothing_again() -> None:
    server, _, audit = paying()
    retry = {"name": "pay", "arguments": ORDER, "inputResponses": ACCEPT}
    async with Client(server.fastmcp, elicitation_handler=_noop) as client:
        state = await _ask(client)
        done = await raw_call(client, {**retry, "requestState": state})
        assert done.get("isError") is False and CHARGED == [100]
        for _ in range(3):
            again = await raw_call(client, {**retry, "requestState": state})
            assert again["isError"] is True
            assert again["content"][0]["text"].startswith("ApprovalDenied: ")
            assert "(answer: invalid_state)" in again["content"][0]["text"]
    assert CHARGED == [100]  # the write ran once, from one approval
    assert _approvals(audit) == [("sam", "accept")] + [("sam", "invalid_state")] * 3


async def test_another_caller_cannot_use_an_approval_state() -> None:
    """Under an authenticator hook the SDK binds the state to no principal: ChainWeaver
    binds it to the gate's caller. A refused attempt does not use the state up."""
    server, switch, audit = paying()
    retry = {"name": "pay", "arguments": ORDER, "inputResponses": ACCEPT}
    async with Client(server.fastmcp, elicitation_handler=_noop) as client:
        state = await _ask(client)
        switch.who = "eve"
        stolen = await raw_call(client, {**retry, "requestState": state})
        assert stolen["isError"] is True and CHARGED == []
        assert "(answer: invalid_state)" in stolen["content"][0]["text"]
    async with Client(server.fastmcp, elicitation_handler=_noop) as other:
        stolen = await raw_call(other, {**retry, "requestState": state})
        assert stolen["isError"] is True and CHARGED == []
    switch.who = "sam"
    async with Client(server.fastmcp, elicitation_handler=_noop) as client:
        done = await raw_call(client, {**retry, "requestState": state})
    assert done.get("isError") is False and CHARGED == [100]
    assert _approvals(audit) == [("eve", "invalid_state"), ("eve", "invalid_state"),
                                 ("sam", "accept")]


async def test_an_approval_for_other_arguments_is_refused() -> None:
    server, _, _ = paying()
    async with Client(server.fastmcp, elicitation_handler=_noop) as client:
        state = await _ask(client)
        for changed in ({**ORDER, "cents": 1}, {**ORDER, "card": "another card"}):
            try:
                refused = await raw_call(client, {"name": "pay", "arguments": changed,
                                                  "inputResponses": ACCEPT,
                                                  "requestState": state})
            except MCPError as error:  # the SDK's own binding refuses it first
                assert error.error.code == -32602
            else:
                assert refused["isError"] is True
    assert CHARGED == []


async def test_the_client_sees_one_approval_per_call_through_fastmcp() -> None:
    """The ordinary client path (its elicitation handler answers input_required) is
    unchanged: each call asks once and runs once."""
    server, _, audit = paying()
    asked: list[str] = []

    async def approve(message: str, *_: Any) -> Any:
        asked.append(message)
        return {"approve": True}

    async with Client(server.fastmcp, elicitation_handler=approve) as client:
        for _ in range(2):
            assert (await client.call_tool("pay", ORDER)).is_error is False
    assert CHARGED == [100, 100] and len(asked) == 2
    assert _approvals(audit) == [("sam", "accept"), ("sam", "accept")]


@pytest.mark.tasks  # needs the tasks extra
async def test_a_server_with_a_task_backend_records_used_states_there() -> None:
    """With tasks=, used states live in the task backend's store (Redis: shared by
    every replica); a replay is refused the same way."""
    server, _, _ = paying(tasks=True)
    retry = {"name": "pay_inline", "arguments": ORDER, "inputResponses": ACCEPT}
    async with Client(server.fastmcp, elicitation_handler=_noop) as client:
        state = await _ask(client, name="pay_inline")
        assert (await raw_call(client, {**retry, "requestState": state}))["isError"] is False
        again = await raw_call(client, {**retry, "requestState": state})
    assert again["isError"] is True and CHARGED == [100]
    assert server._provider.runs.nonces._used == {}  # kept in Docket's store, not here


# ------------------------------------------------------------------ admitted again


def _archiving(server: FlowServer, answer: Any = None) -> Any:
    """An elicitation handler that archives ``pay`` before it approves."""
    async def handler(message: str, *_: Any) -> Any:
        server.executor.registry.set_lifecycle("pay", "archived")
        return answer if answer is not None else {"approve": True}

    return handler


@pytest.mark.parametrize("mode", ERAS)
async def test_a_flow_archived_while_its_approval_waits_does_not_run(mode: str) -> None:
    server, _, audit = paying()
    async with Client(server.fastmcp, mode=mode,
                      elicitation_handler=_archiving(server)) as client:
        try:
            result = await client.call_tool("pay", ORDER, raise_on_error=False)
        except MCPError as error:
            # 2026-07-28: the retry is a new request, and the archived flow is a name
            # that does not exist any more.
            assert mode == "auto" and "Unknown tool" in str(error)
        else:
            assert result.is_error
            text = result.content[0].text
            assert mode == "auto" and "Unknown tool" in text or \
                text == "Flow 'pay' is no longer available; nothing ran."
    assert CHARGED == []
    if mode == "legacy":
        assert _approvals(audit) == [("sam", "flow_unavailable")]


async def test_a_flow_leaving_the_callers_view_while_its_approval_waits_does_not_run() -> None:
    """2025-11-25: the view changes (here the caller's grant is narrowed) while the user
    decides. The refusal says exactly what it says for a flow that vanished."""
    hidden: set[str] = set()

    def visible(caller: CallerIdentity, flow: Flow) -> bool:
        return flow.name not in hidden

    server, _, audit = paying(visible=visible)

    async def narrow(message: str, *_: Any) -> Any:
        hidden.add("pay")
        # The rule's answers are cached per snapshot: a registry change is what makes
        # a new one (as a new flow, or a reloaded flow file, would in a real server).
        server.executor.registry.register_flow(
            Flow("other", "another flow", [FlowStep("validate")]))
        return {"approve": True}

    async with Client(server.fastmcp, mode="legacy", elicitation_handler=narrow) as client:
        result = await client.call_tool("pay", ORDER, raise_on_error=False)
    assert result.is_error and CHARGED == []
    assert result.content[0].text == "Flow 'pay' is no longer available; nothing ran."
    assert _approvals(audit) == [("sam", "flow_unavailable")]


async def test_a_flow_still_published_after_the_wait_runs() -> None:
    """A change that leaves the flow's version published (another flow registered)
    does not stop the run."""
    server, _, _ = paying()

    async def unrelated(message: str, *_: Any) -> Any:
        server.executor.registry.register_flow(
            Flow("other", "another flow", [FlowStep("validate")]))
        return {"approve": True}

    async with Client(server.fastmcp, mode="legacy", elicitation_handler=unrelated) as client:
        result = await client.call_tool("pay", ORDER)
    assert not result.is_error and CHARGED == [100]


@pytest.mark.tasks  # needs the tasks extra
async def test_a_task_whose_flow_is_archived_before_its_answer_runs_nothing() -> None:
    from fastmcp_tasks import call_tool_task
    from support.task_asks import answering, reply, update_task, waiting

    server, _, _ = paying(tasks=True)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        server.executor.registry.set_lifecycle("pay", "archived")
        with pytest.raises(MCPError):  # the task's flow is gone: an unknown task
            await update_task(task, reply(requests, "accept", {"approve": True}))
    assert CHARGED == []


@pytest.mark.tasks  # needs the tasks extra
async def test_a_task_whose_flow_is_archived_after_its_answer_runs_nothing() -> None:
    """The answer is taken, and the flow is archived before the answered leg runs:
    the leg is admitted again and runs no step."""
    from fastmcp_tasks import call_tool_task
    from support.task_asks import answering, reply, update_task, waiting

    server, _, audit = paying(tasks=True)
    tool = server._provider.flow_tool(server._provider.exposure.tool("pay"))
    readmits = tool.readmits

    def archived_meanwhile() -> bool:
        server.executor.registry.set_lifecycle("pay", "archived")
        return readmits()

    object.__setattr__(tool, "readmits", archived_meanwhile)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        await update_task(task, reply(await waiting(task), "accept", {"approve": True}))
        # The task's flow is archived: its caller can no longer reach the task (an
        # unknown id), so the audit says how the leg ended.
        with anyio.fail_after(LIMIT):
            while not any(e.task_status == "completed" for e in audit):
                await anyio.sleep(0.01)
    assert CHARGED == []
    states = [(e.phase, e.task_status, e.reason) for e in audit if e.task_status]
    assert states[-2:] == [("approval", "working", "flow_unavailable"),
                           ("completed", "completed", "ok")]
    (done,) = [e for e in audit if e.task_status == "completed"]
    assert done.outcome == "error"
