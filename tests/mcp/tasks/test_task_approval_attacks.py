"""Approval inside a background task under attack, in memory: the runner stays out of
reach, bad answers are -32602 and leave the task waiting, racing answers and cancels
run the side effect at most once and are audited once, only a JSON true approves, and
transforms on ``server.fastmcp`` (a Namespace, a rename) keep tasks and their modes.

Written by an adversarial review; the problems it found are fixed and kept here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any, Literal

import mcp_types
import pytest
from fastmcp import Client
from fastmcp.server.transforms import Namespace, ToolTransform
from fastmcp.tools.tool_transform import ToolTransformConfig
from fastmcp_tasks import ToolTask, call_tool_task
from mcp import MCPError
from pydantic import BaseModel
from support.task_asks import answering, reply, update_task, waiting

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import (
    AuditEvent,
    CallerIdentity,
    ExposurePolicy,
    FlowServer,
    GateContext,
    SecurityConfig,
    ServingConfig,
    TaskSettings,
    Visibility,
)
from chainweaver.mcp.tasks.runner import RUNNER_NAME

pytestmark = pytest.mark.anyio
LIMIT = 10.0  # seconds: only to stop a hang
SECRET = "4111-1111"
ORDER = {"card": SECRET, "cents": 100}
CHARGED: list[int] = []
HELD: list[str] = []
RELEASE: list[asyncio.Event] = []
# ``bill_held`` (a sync step: it runs in a worker thread, which no cancel can stop) sets
# BILLING when it starts, then charges once the test sets GO_ON.
BILLING = threading.Event()
GO_ON = threading.Event()


class Order(BaseModel):
    card: str
    cents: int


class Stage(BaseModel):
    card: str
    cents: int
    stage: int = 0


@tool(safety=ToolSafetyContract("read"))
def check(order: Order) -> Stage:
    return Stage(card=order.card, cents=order.cents, stage=1)


@tool(safety=ToolSafetyContract("write", requires_approval=True,
                                approval_reason="charges a card"))
def bill(stage: Stage) -> Stage:
    CHARGED.append(stage.cents)
    return stage


@tool(safety=ToolSafetyContract("write", requires_approval=True,
                                approval_reason="charges a card"))
def bill_held(stage: Stage) -> Stage:
    """``bill``, held mid-step until the test lets it charge."""
    BILLING.set()
    GO_ON.wait(LIMIT)
    CHARGED.append(stage.cents)
    return stage


@tool(safety=ToolSafetyContract("read"))
async def wait_here(stage: Stage) -> Stage:
    """Holds the (single) worker slot until the test releases it."""
    HELD.append("held")
    await asyncio.wait_for(RELEASE[0].wait(), LIMIT)
    return stage


class Who:
    """An authenticator whose caller a test switches; ``olga`` sees only ``lookup``, and
    so does anyone while ``narrowed`` is set."""

    def __init__(self) -> None:
        self.who = "sam"
        self.narrowed = False

    def __call__(self, gate: GateContext) -> CallerIdentity:
        narrow = self.who == "olga" or self.narrowed
        flows = ["lookup"] if narrow else ["pay", "pay_held", "slow", "lookup"]
        return CallerIdentity(self.who, {"flows": flows}, subject=self.who)


def shop(audit: list[AuditEvent] | None = None, *, concurrency: int | None = None,
         **options: Any) -> tuple[FlowServer, Who]:
    """``pay`` asks for approval (optional task); ``pay_held`` is ``pay`` held inside
    its charging step; ``slow`` holds a worker slot; ``lookup`` is the one flow
    ``olga`` sees."""
    executor = FlowExecutor(FlowRegistry())
    for t in (check, bill, bill_held, wait_here):
        executor.register_tool(t)
    executor.registry.register_flow(Flow("pay", "charges a card",
                                         [FlowStep("check"), FlowStep("bill")]))
    executor.registry.register_flow(Flow("pay_held", "charges a card, slowly",
                                         [FlowStep("check"), FlowStep("bill_held")]))
    executor.registry.register_flow(Flow("slow", "waits", [FlowStep("check"),
                                                           FlowStep("wait_here")]))
    executor.registry.register_flow(Flow("lookup", "reads", [FlowStep("check")]))
    who = Who()
    rule = Visibility(lambda caller, flow: flow.name in caller.claims.get("flows", []),
                      claims=("flows",))
    server = FlowServer(
        executor, tasks=TaskSettings(url="memory://", concurrency=concurrency),
        policy=ExposurePolicy(allowed_side_effects=["read", "write"], approval="elicit"),
        security=SecurityConfig(authenticator=who, visible=rule, audit_hook=(
            audit.append if audit is not None else None)), **options)
    return server, who


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    CHARGED.clear()
    HELD.clear()
    RELEASE.clear()
    RELEASE.append(asyncio.Event())
    BILLING.clear()
    GO_ON.clear()
    yield
    RELEASE[0].set()
    GO_ON.set()










class _RawUpdateParams(BaseModel):
    taskId: str  # noqa: N815  (wire name)
    inputResponses: Any  # noqa: N815


class _RawUpdate(mcp_types.Request):  # type: ignore[type-arg]
    """A tasks/update whose payload is not validated on the client side."""

    method: Literal["tasks/update"] = "tasks/update"
    params: _RawUpdateParams  # type: ignore[assignment]


async def raw_update(task: ToolTask, responses: Any) -> Any:
    request = _RawUpdate(params=_RawUpdateParams(taskId=task.task_id,
                                                  inputResponses=responses))
    return await task._client.session.send_request(request, mcp_types.Result)  # type: ignore[arg-type]




def unknown(result: mcp_types.CallToolResult, name: str) -> str:
    assert result.is_error
    return str(getattr(result.content[0], "text", "")).replace(name, "X")


async def until(predicate: Any, what: str) -> None:
    for _ in range(int(LIMIT / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------ the runner stays hidden


async def test_the_runner_is_never_callable_while_results_are_being_served() -> None:
    """tasks/get sets the contextvar that resolves the runner; hammer tools/call,
    tools/list and a second client's tasks/get concurrently: the runner (which would
    run ``pay`` with no approval, payload ``approval: False``) never resolves."""
    server, _ = shop()
    payload = {"tool": "pay", "version": "0.1.0", "arguments": ORDER, "caller": "sam",
               "approval": False}
    async with answering(server) as poller, answering(server) as attacker, \
            Client(server.fastmcp, mode="legacy") as legacy:
        task = await call_tool_task(poller, "lookup", ORDER)
        await asyncio.wait_for(task.result(), LIMIT)
        never = unknown(await attacker.call_tool("never_existed", {}, raise_on_error=False),
                        "never_existed")

        async def poll() -> None:
            for _ in range(60):
                assert (await task.status()).status == "completed"

        async def attack(client: Client) -> list[str]:
            seen = []
            for _ in range(60):
                result = await client.call_tool(RUNNER_NAME, payload, raise_on_error=False)
                seen.append(unknown(result, RUNNER_NAME))
                assert RUNNER_NAME not in {t.name for t in await client.list_tools()}
            return seen

        _, modern, old = await asyncio.wait_for(
            asyncio.gather(poll(), attack(attacker), attack(legacy)), 4 * LIMIT)
    assert set(modern) == {never} and set(old) <= {never, never.replace("X", "X")}
    assert all(text for text in old)
    assert CHARGED == []


async def test_the_runner_is_not_reachable_through_tools_only_forms() -> None:
    server, _ = shop(expose_schemas=True, expose_prompts=True, serving=ServingConfig(
        resources_as_tools=True, prompts_as_tools=True))
    async with answering(server) as client:
        names = {t.name for t in await client.list_tools()}
        runner = await client.call_tool(RUNNER_NAME, {}, raise_on_error=False)
        never = await client.call_tool("never_existed", {}, raise_on_error=False)
        prompts = {p.name for p in await client.list_prompts()}
        resources = [str(r.uri) for r in await client.list_resources()]
        errors = []
        for name in (RUNNER_NAME, "never_existed"):
            ref = mcp_types.PromptReference(type="ref/prompt", name=name)
            for call in (client.get_prompt(name, {}),
                         client.complete(ref, {"name": "arguments", "value": ""})):
                try:
                    await call
                    errors.append("answered")
                except MCPError as error:
                    errors.append(f"{error.error.code} "
                                  f"{error.error.message.replace(name, 'X')}")
    assert RUNNER_NAME not in names and unknown(runner, RUNNER_NAME) == unknown(
        never, "never_existed")
    assert errors[:2] == errors[2:] and errors[0] != "answered", errors
    assert RUNNER_NAME not in prompts and not any(RUNNER_NAME in r for r in resources)
    assert CHARGED == []


# ------------------------------------------------------------------ answering


async def test_a_flow_hidden_by_the_view_cannot_become_a_task() -> None:
    server, who = shop()
    who.who = "olga"
    async with answering(server) as client:
        with pytest.raises(Exception) as hidden:
            await call_tool_task(client, "pay", ORDER)
        with pytest.raises(Exception) as never:
            await call_tool_task(client, "never_existed", ORDER)
    assert str(hidden.value).replace("pay", "X") == str(never.value).replace(
        "never_existed", "X")
    assert CHARGED == []


@pytest.mark.parametrize("bad", [
    "yes", 1, None, [True], {"action": "accept", "content": "approve"},
    {"action": "sure"}, {"action": "accept", "content": {"approve": {"nested": True}}},
])
async def test_malformed_answers_are_invalid_params_and_leave_the_task_waiting(
        bad: Any) -> None:
    server, _ = shop()
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        with pytest.raises(MCPError) as refused:
            await update_task(task, {key: bad for key in requests})
        await asyncio.sleep(0.1)
        status = await task.status()
    assert refused.value.error.code == -32602, refused.value.error
    assert status.status == "input_required" and CHARGED == []


@pytest.mark.parametrize("content", [None, {}, {"approve": None}, {"Approve": True},
                                     {"approve": "maybe"}, {"approve": []}])
async def test_accept_without_an_approving_form_runs_nothing_and_is_audited(
        content: Any) -> None:
    audit: list[AuditEvent] = []
    server, _ = shop(audit)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        await update_task(task, reply(await waiting(task), "accept", content))
        done = await task.wait(timeout=LIMIT)
        result = await task.result()
    assert done.status == "completed" and result.is_error and CHARGED == []
    assert [(e.reason, e.decision) for e in audit if e.phase == "approval"] == [
        ("decline", "denied")]


async def test_a_huge_answer_is_taken_once_and_an_unknown_key_is_a_no_op() -> None:
    server, _ = shop()
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        await update_task(task, {f"nope{i}": {"action": "accept", "content": {"approve": True}}
                            for i in range(2_000)})
        assert (await task.status()).status == "input_required"
        await update_task(task, reply(requests, "accept", {"approve": True, "pad": "A" * 500_000}))
        done = await task.wait(timeout=LIMIT)
    assert done.status == "completed" and CHARGED == [100]


@pytest.mark.parametrize("bad", ["yes", 1, ["x"], None])
async def test_a_payload_that_is_not_a_map_of_answers_is_invalid_params(bad: Any) -> None:
    server, _ = shop()
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        await waiting(task)
        with pytest.raises(MCPError) as refused:
            await raw_update(task, bad)
        status = await task.status()
    assert refused.value.error.code == -32602, refused.value.error
    assert status.status == "input_required" and CHARGED == []


async def test_racing_answers_run_the_side_effect_once() -> None:
    server, _ = shop()
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        answers = [update_task(task, reply(requests, "accept", {"approve": True}))
                   for _ in range(8)]
        await asyncio.wait_for(asyncio.gather(*answers), LIMIT)
        done = await task.wait(timeout=LIMIT)
        await asyncio.sleep(0.2)
    assert done.status == "completed" and CHARGED == [100]


async def _current_leg(server: FlowServer, task: ToolTask) -> tuple[str | None, int]:
    """The task's current leg in Docket: its execution key and number (1 asks, 2 runs
    the answered flow)."""
    from fastmcp_tasks.input_store import load_current_leg

    from chainweaver.mcp.fastmcp_seams import running_docket

    return await load_current_leg(running_docket(server.fastmcp), None, task.task_id)


async def _answered_leg_ended(server: FlowServer, task: ToolTask) -> None:
    """Until the task's answered leg (leg 2) is over in Docket, however it ended:
    whatever that leg was going to run or record, it has."""
    from docket.execution import ExecutionState

    from chainweaver.mcp.fastmcp_seams import running_docket

    docket = running_docket(server.fastmcp)
    over = (ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.CANCELLED)
    for _ in range(int(LIMIT / 0.02)):
        leg_key, leg = await _current_leg(server, task)
        assert leg == 2, "the task was never answered"
        execution = await docket.get_execution(leg_key) if leg_key else None
        if execution is None or execution.state in over:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the answered leg never ended")


def _nothing_hidden(audit: list[AuditEvent], task_id: str, status: str) -> None:
    """The invariant, whichever way a cancel and the answers fell: the side effect ran
    at most once; a recorded completion means it ran, with the result's digest; a
    task reported cancelled had its cancellation audited exactly once; and a charge
    was approved in the audit trail before it ran."""
    events = [e for e in audit if e.task_id == task_id and e.kind == "task"]
    trail = [(e.phase, e.task_status) for e in events if e.task_status]
    assert CHARGED in ([], [100]), CHARGED
    completions = [e for e in events if (e.phase, e.task_status) == ("completed", "completed")]
    if completions:
        assert CHARGED == [100] and completions[0].result_sha256, trail
    if status == "cancelled":
        assert trail.count(("state", "cancelled")) == 1, trail
    if CHARGED:
        assert [(e.reason, e.decision) for e in events if e.phase == "approval"] == [
            ("accept", "allowed")], trail


async def test_a_cancel_before_the_answers_stops_the_run() -> None:
    """The cancel lands first (tasks/get says ``cancelled``); six answers then race
    each other and find nothing to answer."""
    audit: list[AuditEvent] = []
    server, _ = shop(audit)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        await task.cancel()
        assert (await task.status()).status == "cancelled"
        await asyncio.wait_for(asyncio.gather(*[
            update_task(task, reply(requests, "accept", {"approve": True}))
            for _ in range(6)]), LIMIT)
        # Each tasks/update is done with the task when it returns: had one been taken,
        # the answered leg would already be the current one.
        _, leg = await _current_leg(server, task)
        status = (await task.status()).status
    _nothing_hidden(audit, task.task_id, status)
    assert leg == 1 and status == "cancelled" and CHARGED == []


async def test_a_cancel_after_the_answers_stops_a_run_still_queued() -> None:
    """Six answers race each other and one is taken while the one worker slot is busy;
    the cancel lands before the answered leg gets the slot."""
    audit: list[AuditEvent] = []
    server, _ = shop(audit, concurrency=1)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        busy = await call_tool_task(client, "slow", ORDER)
        await until(lambda: HELD, "the slot to be taken")
        await asyncio.wait_for(asyncio.gather(*[
            update_task(task, reply(requests, "accept", {"approve": True}))
            for _ in range(6)]), LIMIT)
        await task.cancel()
        RELEASE[0].set()
        await asyncio.wait_for(busy.result(), LIMIT)
        await _answered_leg_ended(server, task)
        status = (await task.status()).status
    _nothing_hidden(audit, task.task_id, status)
    assert status == "cancelled" and CHARGED == []


async def test_a_cancel_during_the_charging_step_does_not_hide_the_charge() -> None:
    """Cancellation is cooperative: a cancel that lands while the answered leg's
    charging step runs cannot undo it (tasks/get then says ``cancelled``, as
    fastmcp-tasks reports every cancelled task; docs/tasks.md says so). The charge
    still happens once, and its approval is in the audit trail."""
    audit: list[AuditEvent] = []
    server, _ = shop(audit)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay_held", ORDER, raise_on_error=False)
        requests = await waiting(task)
        await asyncio.wait_for(asyncio.gather(*[
            update_task(task, reply(requests, "accept", {"approve": True}))
            for _ in range(6)]), LIMIT)
        await until(BILLING.is_set, "the charging step to start")
        await task.cancel()
        GO_ON.set()
        await until(lambda: CHARGED, "the charging step to end")
        await _answered_leg_ended(server, task)
        status = (await task.status()).status
    _nothing_hidden(audit, task.task_id, status)
    assert status == "cancelled" and CHARGED == [100]


async def test_a_cancel_after_the_run_completed_leaves_it_completed() -> None:
    """The answered run finishes first; a cancel then changes nothing: the task stays
    completed, with its completion (and the result's digest) audited."""
    audit: list[AuditEvent] = []
    server, _ = shop(audit)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        await asyncio.wait_for(asyncio.gather(*[
            update_task(task, reply(requests, "accept", {"approve": True}))
            for _ in range(6)]), LIMIT)
        assert (await task.wait(timeout=LIMIT)).status == "completed"
        await task.cancel()
        status = (await task.status()).status
    _nothing_hidden(audit, task.task_id, status)
    trail = [(e.phase, e.task_status) for e in audit
             if e.task_id == task.task_id and e.kind == "task" and e.task_status]
    assert status == "completed" and CHARGED == [100]
    assert ("completed", "completed") in trail and ("state", "cancelled") not in trail


async def test_the_caller_cannot_answer_once_the_flow_left_its_view() -> None:
    audit: list[AuditEvent] = []
    server, who = shop(audit)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        who.narrowed = True
        with pytest.raises(MCPError) as refused:
            await update_task(task, reply(requests, "accept", {"approve": True}))
        with pytest.raises(MCPError) as cancel:
            await task.cancel()
        who.narrowed = False
        status = (await task.status()).status
        await asyncio.gather(*[task.cancel() for _ in range(4)])  # concurrent cancels
    assert refused.value.error.code == cancel.value.error.code == -32602
    assert refused.value.error.message == f"Task {task.task_id} not found"
    assert status == "input_required" and CHARGED == []
    trail = [(e.phase, e.task_status) for e in audit
             if e.task_id == task.task_id and e.kind == "task" and e.task_status]
    assert trail.count(("state", "cancelled")) == 1, trail


async def test_a_legacy_client_cannot_answer_a_task() -> None:
    server, _ = shop()
    async with answering(server) as modern, \
            Client(server.fastmcp, mode="legacy") as legacy:
        task = await call_tool_task(modern, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        theirs = ToolTask(legacy, "pay", task.create_result)
        with pytest.raises(MCPError) as refused:
            await update_task(theirs, reply(requests, "accept", {"approve": True}))
        assert (await task.status()).status == "input_required"
    assert refused.value.error.code not in (-32603,) and CHARGED == []


# ------------------------------------------------------------------ found problems


@pytest.mark.parametrize("value", ["yes", "on", "t", 1])
async def test_only_a_json_true_approves_a_side_effect(value: Any) -> None:
    server, _ = shop()
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        await update_task(task, reply(await waiting(task), "accept", {"approve": value}))
        await task.wait(timeout=LIMIT)
    assert CHARGED == [], (
        f"approve={value!r} (the schema asks for a boolean) approved a 'write' step: "
        "ApprovalAnswer validates in pydantic's lax mode")


async def _answer_then_cancel_while_queued(audit: list[AuditEvent]) -> str:
    """Answer ``pay`` while the one worker slot is busy, then cancel it before its
    answered leg starts. Returns the task id."""
    server, _ = shop(audit, concurrency=1)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        busy = await call_tool_task(client, "slow", ORDER)
        await until(lambda: HELD, "the slot to be taken")
        await update_task(task, reply(requests, "accept", {"approve": True}))
        await task.cancel()
        RELEASE[0].set()
        await asyncio.wait_for(busy.result(), LIMIT)
        await _answered_leg_ended(server, task)  # the cancelled leg ran, or was dropped
        assert (await task.status()).status == "cancelled" and CHARGED == []
        return task.task_id


async def test_a_leg_that_a_cancel_could_not_stop_does_not_run() -> None:
    """A cancel marks the task, then asks Docket to stop its current leg; a leg a
    worker has just picked up can miss that. Simulated here: the task is marked
    cancelled (fastmcp-tasks' own marker) while its answered leg waits for a worker
    slot, and Docket is not told. The runner checks the mark before anything runs."""
    from docket.execution import ExecutionState
    from fastmcp_tasks.input_store import load_current_leg, mark_cancelled

    from chainweaver.mcp.fastmcp_seams import running_docket

    server, _ = shop(concurrency=1)
    async with answering(server) as client:
        task = await call_tool_task(client, "pay", ORDER, raise_on_error=False)
        requests = await waiting(task)
        busy = await call_tool_task(client, "slow", ORDER)
        await until(lambda: HELD, "the slot to be taken")
        await update_task(task, reply(requests, "accept", {"approve": True}))
        await mark_cancelled(running_docket(server.fastmcp), None, task.task_id, 60)
        RELEASE[0].set()
        await asyncio.wait_for(busy.result(), LIMIT)
        docket = running_docket(server.fastmcp)
        leg_key, leg = await load_current_leg(docket, None, task.task_id)
        for _ in range(int(LIMIT / 0.05)):  # the answered leg gets the slot, and ends
            execution = await docket.get_execution(leg_key)
            if execution is not None and execution.state == ExecutionState.COMPLETED:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the answered leg never ran")
        status = (await task.status()).status
    assert leg == 2 and status == "cancelled" and CHARGED == []


async def test_cancelling_an_answered_task_before_it_resumes_is_audited() -> None:
    audit: list[AuditEvent] = []
    task_id = await _answer_then_cancel_while_queued(audit)
    states = [(e.phase, e.task_status) for e in audit
              if e.task_id == task_id and e.kind == "task" and e.task_status]
    assert ("state", "cancelled") in states, (
        f"the task was cancelled, but its audit trail ends {states[-1]}: {states}")


async def test_a_namespaced_server_runs_approval_tasks() -> None:
    server, _ = shop()
    server.fastmcp.add_transform(Namespace("shop"))
    async with answering(server) as client:
        try:
            task = await call_tool_task(client, "shop_pay", ORDER, raise_on_error=False)
        except MCPError as error:
            raise AssertionError(
                f"creating a task through a Namespace transform: {error.error.code} "
                f"{error.error.message} (Docket knows the runner only by its transformed "
                "key; tasks/get would also look it up untransformed)") from error
        await update_task(task, reply(await waiting(task), "accept", {"approve": True}))
        result = await asyncio.wait_for(task.result(), LIMIT)
    assert not result.is_error and CHARGED == [100]


async def test_a_renamed_required_task_flow_still_runs_only_as_a_task() -> None:
    executor = FlowExecutor(FlowRegistry())
    for t in (check, bill):
        executor.register_tool(t)
    executor.registry.register_flow(Flow("pay_later", "charges a card, in the background",
                                         [FlowStep("check"), FlowStep("bill")],
                                         task_mode="required"))
    server = FlowServer(executor, tasks="memory://",
                        policy=ExposurePolicy(allowed_side_effects=["read", "write"],
                                              approval="elicit"))
    server.fastmcp.add_transform(ToolTransform({"pay_later": ToolTransformConfig(
        name="later")}))

    async def approve(*_: Any) -> dict[str, bool]:
        return {"approve": True}

    async with Client(server.fastmcp, mode="legacy", elicitation_handler=approve) as client:
        meta = {t.name: t.meta for t in await client.list_tools()}["later"]
        assert meta is not None and meta["chainweaver"]["task_mode"] == "required"
        try:
            result = await asyncio.wait_for(client.call_tool("later", ORDER), LIMIT)
        except MCPError as error:
            assert error.error.code == -32021
            return
    raise AssertionError(
        f"'later' (task_mode 'required') ran inline on 2025-11-25 (charged {CHARGED}, "
        f"error={result.is_error}): FlowTasksExtension only recognises a FlowTool instance, "
        "and a ToolTransform wraps it")


async def test_cancelling_a_queued_task_is_audited() -> None:
    audit: list[AuditEvent] = []
    server, _ = shop(audit, concurrency=1)
    async with answering(server) as client:
        busy = await call_tool_task(client, "slow", ORDER)
        await until(lambda: HELD, "the slot to be taken")
        task = await call_tool_task(client, "lookup", ORDER)
        await task.cancel()
        RELEASE[0].set()
        await asyncio.wait_for(busy.result(), LIMIT)
        await asyncio.sleep(0.3)
        status = (await task.status()).status
    trail = [(e.phase, e.task_status) for e in audit
             if e.task_id == task.task_id and e.kind == "task" and e.task_status]
    assert status == "cancelled"
    assert ("state", "cancelled") in trail, (
        f"tasks/get says 'cancelled'; the audit trail is only {trail}")
