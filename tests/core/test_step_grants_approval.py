"""Approval keeps its meaning under step grants: an approval covers the steps and the
caller it was asked for. A covered step whose grant decision changes after approval
(still allowed, but now by a delegation, or for another caller) asks the approval hook
again, for the steps that have not run; declined, the run stops before that step. A
refusal still stops the run as before. Both lanes, sub-flows and retries."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from chainweaver import (
    ALWAYS_APPROVE,
    Caller,
    Delegation,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    ToolSafetyContract,
    tool,
)
from chainweaver.run_events import ApprovalRequest

RAN: list[str] = []
FULL = Caller("ann", frozenset({"orders.read", "orders.export"}))
NOW: dict[str, Any] = {}  # the caller as the directory says it is now
EXPORTS = ToolSafetyContract("write", requires_approval=True, approval_reason="exports")


class Order(BaseModel):
    order: str


@tool(safety=ToolSafetyContract("read"), requires=["orders.read"])
def load(order: str) -> Order:
    RAN.append("load")
    change = NOW.pop("after_load", None)
    if change is not None:  # the grant changes while the run is under way
        NOW["caller"] = change
    return Order(order=order)


@tool(safety=EXPORTS, requires=["orders.export"])
def export(order: str) -> Order:
    RAN.append("export")
    return Order(order=order)


@tool(safety=EXPORTS, requires=["orders.export"])
async def export_async(order: str) -> Order:
    RAN.append("export_async")
    return Order(order=order)


TRIES = {"left": 0}


@tool(safety=ToolSafetyContract("write", idempotent=True, requires_approval=True,
                                approval_reason="exports"), requires=["orders.export"])
def shaky_export(order: str) -> Order:
    RAN.append("shaky_export")
    if TRIES["left"] > 0:
        TRIES["left"] -= 1
        NOW["caller"] = Caller("ann", frozenset({"orders.read"}))  # revoked meanwhile
        raise ConnectionError("export endpoint busy")
    return Order(order=order)


def executor() -> FlowExecutor:
    RAN.clear()
    NOW.clear()
    NOW["caller"] = FULL
    TRIES["left"] = 0
    ex = FlowExecutor(FlowRegistry())
    for item in (load, export, export_async, shaky_export):
        ex.register_tool(item)
    register = ex.registry.register_flow
    service = [Delegation("export", "the export service runs it")]
    register(Flow("export_order", "load, then export", [FlowStep("load"),
                                                        FlowStep("export")],
                  delegations=service))
    register(Flow("export_async_order", "load, then export (async tool)", [
        FlowStep("load"), FlowStep("export_async")],
        delegations=[Delegation("export_async", "the export service runs it")]))
    register(Flow("undelegated", "load, then export", [FlowStep("load"),
                                                       FlowStep("export")]))
    register(Flow("exporter", "exports", [FlowStep("export")]))
    register(Flow("nested", "load, then export in a sub-flow", [
        FlowStep("load"), FlowStep(flow="exporter", id="archive")],
        delegations=[Delegation("archive/export", "archiving exports as the service")]))
    register(Flow("timed", "load, then export in a sub-flow with a timeout", [
        FlowStep("load"), FlowStep(flow="exporter", id="archive", timeout=30)],
        delegations=[Delegation("archive/export", "archiving exports as the service")]))
    register(Flow("retried", "export with retries", [
        FlowStep("load"),
        FlowStep("shaky_export", retry=RetryPolicy(max_attempts=2, backoff_seconds=0,
                                                   retry_on=[ConnectionError]))],
        delegations=[Delegation("shaky_export", "the export service runs it")]))
    return ex


class Asker:
    """An approval hook that records each question and answers from a script."""

    def __init__(self, *answers: bool, is_async: bool = False) -> None:
        self.answers = list(answers)
        self.asked: list[ApprovalRequest] = []
        self.threads: list[int] = []
        self.loops: list[Any] = []
        self.is_async = is_async

    def _answer(self, request: ApprovalRequest) -> bool:
        self.asked.append(request)
        self.threads.append(threading.get_ident())
        return self.answers.pop(0) if self.answers else False

    def __call__(self, request: ApprovalRequest) -> Any:
        if not self.is_async:
            return self._answer(request)

        async def answer() -> bool:
            self.loops.append(asyncio.get_running_loop())
            return self._answer(request)
        return answer()


def run(ex: FlowExecutor, lane: str, name: str, hook: Any, caller: Any = None) -> Any:
    caller = caller if caller is not None else (lambda: NOW["caller"])
    if lane == "sync":
        return ex.execute_flow(name, {"order": "A-1"}, approve=hook, caller=caller)
    return asyncio.run(ex.execute_flow_async(name, {"order": "A-1"}, approve=hook,
                                             caller=caller))


LANES = ["sync", "async"]


@pytest.mark.parametrize("lane", LANES)
def test_the_question_says_which_grant_decisions_it_is_asked_under(lane: str) -> None:
    ex = executor()
    asker = Asker(True)
    result = run(ex, lane, "export_order", asker)
    assert result.success and RAN == ["load", "export"]
    (question,) = asker.asked
    assert question.caller_id == "ann" and question.changed is None
    assert question.grants == (("export", "tool", "caller"),)
    plain = ex.plan(ex.registry.get_flow("export_order")).approval[0]
    assert plain.grants == () and question.fingerprint != plain.fingerprint


@pytest.mark.parametrize("lane", LANES)
def test_a_step_now_allowed_by_a_delegation_asks_again_and_runs_once_approved(
        lane: str) -> None:
    ex = executor()
    NOW["after_load"] = Caller("ann", frozenset({"orders.read"}))  # export revoked
    asker = Asker(True, True)
    result = run(ex, lane, "export_order", asker)
    assert result.success, result.error
    assert RAN == ["load", "export"]
    first, again = asker.asked
    assert first.grants == (("export", "tool", "caller"),)
    assert again.changed == "export" and again.step_ids == ("export",)
    assert again.grants == (("export", "tool", "delegation"),)


@pytest.mark.parametrize("lane", LANES)
def test_declining_the_question_asked_again_stops_the_run_before_the_step(
        lane: str) -> None:
    ex = executor()
    NOW["after_load"] = Caller("ann", frozenset({"orders.read"}))
    asker = Asker(True, False)
    result = run(ex, lane, "export_order", asker)
    assert not result.success and RAN == ["load"]  # export never ran
    error = result.error
    assert error.type == "ApprovalDenied" and error.step_id == "export"
    assert "approved as allowed by the caller's own grants and is now allowed by the " \
        "flow's delegation" in error.message
    assert [r.status for r in result.steps] == ["completed", "failed"]
    assert len(asker.asked) == 2


@pytest.mark.parametrize("lane", LANES)
def test_another_caller_after_approval_asks_again(lane: str) -> None:
    ex = executor()
    NOW["after_load"] = Caller("bob", frozenset({"orders.read", "orders.export"}))
    asker = Asker(True, False)
    result = run(ex, lane, "export_order", asker)
    assert result.error.type == "ApprovalDenied" and RAN == ["load"]
    assert "approved for another caller" in result.error.message
    assert asker.asked[1].caller_id == "bob" and asker.asked[1].changed == "export"


@pytest.mark.parametrize("lane", LANES)
def test_a_refusal_after_approval_still_stops_the_run_without_asking_again(
        lane: str) -> None:
    ex = executor()
    NOW["after_load"] = Caller("ann", frozenset({"orders.read"}))  # no delegation here
    asker = Asker(True, True)
    result = run(ex, lane, "undelegated", asker)
    assert result.error.type == "StepRefused" and RAN == ["load"]
    (question,) = asker.asked
    assert question.grants == (("export", "tool", "caller"),)


@pytest.mark.parametrize("lane", LANES)
def test_an_unchanged_decision_is_asked_once(lane: str) -> None:
    ex = executor()
    asker = Asker(True)
    assert run(ex, lane, "nested", asker).success
    assert len(asker.asked) == 1 and RAN == ["load", "export"]
    assert asker.asked[0].grants == (("archive", "subflow", "open"),
                                     ("archive/export", "tool", "caller"))


@pytest.mark.parametrize("lane", LANES)
def test_a_sub_flows_step_asks_again_and_a_decline_stops_the_whole_run(lane: str) -> None:
    ex = executor()
    NOW["after_load"] = Caller("ann", frozenset({"orders.read"}))
    asker = Asker(True, False)
    result = run(ex, lane, "nested", asker)
    assert RAN == ["load"]
    assert result.error.type == "ApprovalDenied" and result.error.step_id == "archive"
    assert "(at step 'archive/export')" in result.error.message
    assert asker.asked[1].changed == "archive/export"
    assert asker.asked[1].step_ids == ("archive/export",)


@pytest.mark.parametrize("lane", LANES)
def test_a_retry_after_the_grant_changed_asks_again(lane: str) -> None:
    ex = executor()
    TRIES["left"] = 1  # the first attempt fails, and the grant is revoked meanwhile
    asker = Asker(True, False)
    result = run(ex, lane, "retried", asker)
    assert RAN == ["load", "shaky_export"]  # the retry never ran
    assert result.error.type == "ApprovalDenied"
    assert asker.asked[1].changed == "shaky_export"


def test_asked_again_from_a_worker_thread_the_async_hook_runs_on_the_runs_loop() -> None:
    ex = executor()
    NOW["after_load"] = Caller("ann", frozenset({"orders.read"}))
    asker = Asker(True, True, is_async=True)

    async def main() -> tuple[Any, Any]:
        result = await ex.execute_flow_async("export_order", {"order": "A-1"},
                                             approve=asker, caller=lambda: NOW["caller"])
        return result, asyncio.get_running_loop()

    result, loop = asyncio.run(main())
    assert result.success and RAN == ["load", "export"]
    assert len(asker.loops) == 2 and all(seen is loop for seen in asker.loops)


def test_an_async_tool_asks_again_on_the_loop() -> None:
    ex = executor()
    NOW["after_load"] = Caller("ann", frozenset({"orders.read"}))
    asker = Asker(True, False, is_async=True)
    result = asyncio.run(ex.execute_flow_async(
        "export_async_order", {"order": "A-1"}, approve=asker,
        caller=lambda: NOW["caller"]))
    assert result.error.type == "ApprovalDenied" and RAN == ["load"]


def test_a_run_approved_without_asking_keeps_no_record() -> None:
    # ALWAYS_APPROVE asks nobody: there is no question to ask again.
    ex = executor()
    NOW["after_load"] = Caller("ann", frozenset({"orders.read"}))
    plan = ex.plan(ex.registry.get_flow("export_order"))
    guard = ex.step_guard(plan, lambda: NOW["caller"])
    assert guard is not None
    result = ex.execute_flow("export_order", {"order": "A-1"}, approve=ALWAYS_APPROVE,
                             guard=guard)
    assert result.success and RAN == ["load", "export"]
    assert guard.approved is None


@pytest.mark.parametrize("lane", LANES)
def test_a_sub_flow_with_a_timeout_asks_again_where_the_run_was_approved(lane: str
                                                                         ) -> None:
    # The sub-flow runs on a private loop in a helper thread: the question is still
    # asked of the run's own hook (on the run's loop, in the async lane).
    ex = executor()
    NOW["after_load"] = Caller("ann", frozenset({"orders.read"}))
    asker = Asker(True, True, is_async=True)
    if lane == "sync":
        result = ex.execute_flow("timed", {"order": "A-1"}, approve=asker,
                                 caller=lambda: NOW["caller"])
        assert result.success and RAN == ["load", "export"]
    else:
        async def main() -> Any:
            result = await ex.execute_flow_async("timed", {"order": "A-1"}, approve=asker,
                                                 caller=lambda: NOW["caller"])
            return result, asyncio.get_running_loop()

        result, loop = asyncio.run(main())
        assert result.success and RAN == ["load", "export"]
        assert all(seen is loop for seen in asker.loops)
    assert [q.changed for q in asker.asked] == [None, "archive/export"]
