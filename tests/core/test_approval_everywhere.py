"""A flow that needs approval never runs unasked, through any entry point.

Every way of running a flow (``execute_flow``, ``execute_flow_async``, with or without a
compiled ``plan=``) refuses a flow with a step that needs approval (its tool, its
fallback, a step of a sub-flow, or a flow declaring it) unless the caller passes a hook
or the visible opt-out ``ALWAYS_APPROVE``: the refusal is a failed result
(``ApprovalRequired``) and no step runs. A hook that says anything but ``True`` runs
nothing either. A sub-flow runs under the decision of the run that started it.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import chainweaver
from chainweaver import (
    ALWAYS_APPROVE,
    ExecutionResult,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.run_events import (
    ApprovalRequest,
    CoveredStep,
    RunObserver,
    approval_request,
)

RAN: list[str] = []  # every tool call, in order


class Number(BaseModel):
    n: int


@tool(safety=ToolSafetyContract("read"))
def plain(value: Number) -> Number:
    RAN.append("plain")
    return Number(n=value.n + 1)


@tool(safety=ToolSafetyContract("read", requires_approval=True,
                                approval_reason="reads personal data"))
def read_profile(value: Number) -> Number:
    RAN.append("read_profile")
    return value


@tool(safety=ToolSafetyContract("write", requires_approval=True,
                                approval_reason="deletes the account"))
def delete_account(value: Number) -> Number:
    RAN.append("delete_account")
    return value


@tool(safety=ToolSafetyContract("read"))
def flaky(value: Number) -> Number:
    RAN.append("flaky")
    raise ConnectionError("down")


@tool(safety=ToolSafetyContract("write", requires_approval=True,
                                approval_reason="charges a card"))
def charge(value: Number) -> Number:
    RAN.append("charge")
    return value


# name -> (the steps one approval covers, as (path, tool, side effects, reason, fallback))
NEEDS_APPROVAL: dict[str, tuple[tuple[str, str, str, str | None, bool], ...]] = {
    "tool": (("delete_account", "delete_account", "write", "deletes the account", False),),
    "fallback": (("flaky", "charge", "write", "charges a card", True),),
    "subflow": (("inner/delete_account", "delete_account", "write",
                 "deletes the account", False),),
    "declared": (("plain", "plain", "read", "audited flow", False),),
    "read_then_delete": (
        ("read_profile", "read_profile", "read", "reads personal data", False),
        ("delete_account", "delete_account", "write", "deletes the account", False)),
}


@pytest.fixture
def executor() -> FlowExecutor:
    RAN.clear()
    executor = FlowExecutor(FlowRegistry())
    for t in (plain, read_profile, delete_account, flaky, charge):
        executor.register_tool(t)
    register = executor.registry.register_flow
    register(Flow("free", "needs no approval",
                  [FlowStep("plain", id="once"), FlowStep("plain", id="again")]))
    register(Flow("tool", "a step's tool needs approval",
                  [FlowStep("plain"), FlowStep("delete_account")]))
    register(Flow("fallback", "only the fallback needs approval",
                  [FlowStep("plain"), FlowStep("flaky", on_error="fallback", fallback="charge")]))
    register(Flow("inner", "the sub-flow", [FlowStep("plain"), FlowStep("delete_account")]))
    register(Flow("subflow", "a sub-flow's step needs approval",
                  [FlowStep("plain", id="first"), FlowStep(flow="inner")]))
    register(Flow("declared", "the flow's own contract needs approval", [FlowStep("plain")],
                  safety=ToolSafetyContract("read", requires_approval=True,
                                            approval_reason="audited flow")))
    register(Flow("read_then_delete", "a read and a delete, both need approval",
                  [FlowStep("read_profile"), FlowStep("plain"), FlowStep("delete_account")]))
    return executor


def run_sync(executor: FlowExecutor, name: str, **options: Any) -> ExecutionResult:
    return executor.execute_flow(name, {"n": 1}, **options)


def run_async(executor: FlowExecutor, name: str, **options: Any) -> ExecutionResult:
    return asyncio.run(executor.execute_flow_async(name, {"n": 1}, **options))


def run_planned(executor: FlowExecutor, name: str, **options: Any) -> ExecutionResult:
    plan = executor.plan(executor.registry.get_flow(name))
    return executor.execute_flow(name, {"n": 1}, plan=plan, **options)


def run_planned_async(executor: FlowExecutor, name: str, **options: Any) -> ExecutionResult:
    plan = executor.plan(executor.registry.get_flow(name))
    return asyncio.run(executor.execute_flow_async(name, {"n": 1}, plan=plan, **options))


ENTRY_POINTS: list[Callable[..., ExecutionResult]] = [run_sync, run_async, run_planned,
                                                      run_planned_async]


def covered(executor: FlowExecutor, name: str) -> tuple[tuple[Any, ...], ...]:
    request = approval_request(executor.plan(executor.registry.get_flow(name)))
    assert request is not None
    return tuple((s.step_id, s.tool_name, s.side_effects, s.reason, s.fallback)
                 for s in request.steps)


# ------------------------------------------------------------ what one approval covers


@pytest.mark.parametrize("name", sorted(NEEDS_APPROVAL))
def test_the_request_lists_exactly_the_steps_that_need_approval(
        executor: FlowExecutor, name: str) -> None:
    assert covered(executor, name) == NEEDS_APPROVAL[name]
    assert approval_request(executor.plan(executor.registry.get_flow("free"))) is None


def test_a_read_and_a_later_delete_are_both_covered_the_plain_step_is_not(
        executor: FlowExecutor) -> None:
    request = approval_request(executor.plan(executor.registry.get_flow("read_then_delete")))
    assert request is not None
    assert request.step_ids == ("read_profile", "delete_account")
    assert [s.reason for s in request.steps] == ["reads personal data", "deletes the account"]
    assert "plain" not in request.describe()
    # A request binds to everything it shows: another question, another fingerprint.
    other = ApprovalRequest(request.flow_name, request.flow_version, request.steps[:1])
    assert other.fingerprint != request.fingerprint


def test_steps_of_a_flow_declaring_approval_are_covered_with_its_reason(
        executor: FlowExecutor) -> None:
    executor.registry.register_flow(Flow(
        "audited_outer", "a declared flow running a sub-flow", [FlowStep(flow="tool")],
        safety=ToolSafetyContract("write", requires_approval=True, approval_reason="audit")))
    assert covered(executor, "audited_outer") == (
        ("tool/plain", "plain", "read", "audit", False),
        ("tool/delete_account", "delete_account", "write", "deletes the account", False))


# ------------------------------------------------------------------ no hook: refused


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name", sorted(NEEDS_APPROVAL))
def test_every_entry_point_refuses_without_a_hook_and_runs_nothing(
        executor: FlowExecutor, entry: Callable[..., ExecutionResult], name: str) -> None:
    observer = Watcher()
    result = entry(executor, name, observer=observer)
    assert not result.success and result.error is not None
    assert result.error.type == "ApprovalRequired"
    message = result.error.message
    assert repr(name) in message and "ALWAYS_APPROVE" in message
    for path, tool_name, _, reason, _ in NEEDS_APPROVAL[name]:
        assert repr(path) in message and repr(tool_name) in message and str(reason) in message
    assert result.steps == [] and result.final_output is None and RAN == []
    assert observer.events == [("run_finished", "ApprovalRequired")]


def test_the_refusal_names_the_first_covered_top_level_step(executor: FlowExecutor) -> None:
    error = run_sync(executor, "subflow").error
    assert error is not None and (error.step_id, error.step_index) == ("inner", 1)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_flow_needing_no_approval_runs_without_a_hook(
        executor: FlowExecutor, entry: Callable[..., ExecutionResult]) -> None:
    result = entry(executor, "free")
    assert result.success and result.final_output == {"n": 3} and RAN == ["plain", "plain"]


# ------------------------------------------------------------ a hook that says no


async def async_no(request: ApprovalRequest) -> bool:
    return False


def raising(request: ApprovalRequest) -> bool:
    raise RuntimeError("hook bug")


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name", sorted(NEEDS_APPROVAL))
@pytest.mark.parametrize("hook", [lambda request: False, lambda request: "yes",
                                  lambda request: None, async_no, raising])
def test_a_hook_that_does_not_approve_runs_nothing(
        executor: FlowExecutor, entry: Callable[..., ExecutionResult], name: str,
        hook: Callable[[ApprovalRequest], Any]) -> None:
    result = entry(executor, name, approve=hook)
    assert result.error is not None and result.error.type == "ApprovalDenied"
    assert result.steps == [] and RAN == []


# ---------------------------------------------------- a hook that says yes, the opt-out


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name", sorted(NEEDS_APPROVAL))
def test_the_opt_out_runs_the_flow(
        executor: FlowExecutor, entry: Callable[..., ExecutionResult], name: str) -> None:
    result = entry(executor, name, approve=ALWAYS_APPROVE)
    assert result.success, result.error
    assert RAN  # the steps ran


def test_the_fallback_that_needed_approval_ran_under_it(executor: FlowExecutor) -> None:
    result = run_sync(executor, "fallback", approve=ALWAYS_APPROVE)
    assert result.success and RAN == ["plain", "flaky", "charge"]
    assert result.steps[1].fallback == "charge"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_hook_is_asked_once_for_the_whole_run_sub_flows_included(
        executor: FlowExecutor, entry: Callable[..., ExecutionResult], kind: str) -> None:
    asked: list[tuple[str, ...]] = []

    def sync_yes(request: ApprovalRequest) -> bool:
        asked.append(request.step_ids)
        assert RAN == []  # before any step
        return True

    async def async_yes(request: ApprovalRequest) -> bool:
        return sync_yes(request)

    result = entry(executor, "subflow", approve=sync_yes if kind == "sync" else async_yes)
    assert result.success and asked == [("inner/delete_account",)]
    assert RAN == ["plain", "plain", "delete_account"]


@pytest.mark.parametrize("lane", ["sync", "async"])
def test_a_sub_flow_with_a_timeout_runs_under_the_parents_decision(
        executor: FlowExecutor, lane: str) -> None:
    """A sub-flow step with a timeout is a run of its own on a private loop (sync lane)."""
    executor.registry.register_flow(Flow("timed", "a timed sub-flow step",
                                         [FlowStep(flow="inner", timeout=5)]))
    runner = run_sync if lane == "sync" else run_async
    refused = runner(executor, "timed")
    assert refused.error is not None and refused.error.type == "ApprovalRequired"
    assert RAN == []
    result = runner(executor, "timed", approve=ALWAYS_APPROVE)
    assert result.success and RAN == ["plain", "delete_account"]


def test_the_opt_out_is_exported_and_reads_as_itself() -> None:
    assert chainweaver.ALWAYS_APPROVE is ALWAYS_APPROVE
    assert repr(ALWAYS_APPROVE) == "ALWAYS_APPROVE"
    assert pickle.loads(pickle.dumps(ALWAYS_APPROVE)) is ALWAYS_APPROVE


@pytest.mark.parametrize("approve", [True, "yes", 1])
def test_approve_must_be_a_hook(executor: FlowExecutor, approve: Any) -> None:
    with pytest.raises(TypeError, match="approve must be"):
        run_sync(executor, "tool", approve=approve)
    with pytest.raises(TypeError, match="approve must be"):
        run_async(executor, "tool", approve=approve)
    assert RAN == []


def test_the_lanes_refuse_by_default(executor: FlowExecutor) -> None:
    """Below the executor too: a new entry point that forgets approve= refuses."""
    from chainweaver.engine.lanes import Lanes

    plan = executor.plan(executor.registry.get_flow("tool"))
    lanes = Lanes(2, 2)
    refused = lanes.run_sync(plan, {"n": 1})
    assert refused.error is not None and refused.error.type == "ApprovalRequired"
    result = asyncio.run(lanes.run_async(plan, {"n": 1}))
    assert result.error is not None and result.error.type == "ApprovalRequired"
    assert RAN == []


class Watcher(RunObserver):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self.events.append(("run_started", flow_name))

    def step_started(self, record: Any) -> None:
        self.events.append(("step_started", record.step_id))

    def run_finished(self, result: ExecutionResult) -> None:
        self.events.append(("run_finished", result.error.type if result.error else None))


def test_covered_step_is_the_public_shape() -> None:
    step = CoveredStep("a/b", "t", "write", None, 0)
    assert step.fallback is False and "no reason given" in ApprovalRequest(
        "f", "1.0.0", (step,)).describe()
