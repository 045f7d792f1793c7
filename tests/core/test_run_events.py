"""Run events: an observer told about every step in both lanes, a cooperative cancellation
that stops a run at the next step boundary, and an approval hook awaited before any step."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    ToolSafetyContract,
    tool,
)
from chainweaver.run_events import (
    ApprovalRequest,
    Cancellation,
    CoveredStep,
    RunObserver,
    approval_request,
)

READ = ToolSafetyContract("read")
WRITE_APPROVAL = ToolSafetyContract("write", requires_approval=True,
                                    approval_reason="moves money")


class Number(BaseModel):
    n: int


class Recorder(RunObserver):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self.events.append(("run_started", flow_name, total_steps))

    def step_started(self, record: Any) -> None:
        with self.lock:
            self.events.append(("started", record.step_id, record.status))

    def step_retrying(self, record: Any, error: Any) -> None:
        with self.lock:
            self.events.append(("retrying", record.step_id, error.type))

    def step_finished(self, record: Any) -> None:
        with self.lock:
            self.events.append(("finished", record.step_id, record.status))

    def run_finished(self, result: Any) -> None:
        self.events.append(("run_finished", result.success,
                            result.error.type if result.error else None))


FLAKY_CALLS: list[int] = []
SIDE_EFFECTS: list[int] = []


@tool(safety=READ)
def add_one(value: Number) -> Number:
    return Number(n=value.n + 1)


@tool(safety=READ)
async def double(value: Number) -> Number:
    return Number(n=value.n * 2)


@tool(safety=READ)
def flaky(value: Number) -> Number:
    FLAKY_CALLS.append(value.n)
    if len(FLAKY_CALLS) % 2 == 1:
        raise ConnectionError("try again")
    return value


@tool(safety=READ)
def explode(value: Number) -> Number:
    raise RuntimeError("secret 42")


@tool(safety=WRITE_APPROVAL)
def transfer(value: Number) -> Number:
    SIDE_EFFECTS.append(value.n)
    return value


@pytest.fixture
def executor() -> FlowExecutor:
    FLAKY_CALLS.clear()
    SIDE_EFFECTS.clear()
    executor = FlowExecutor(FlowRegistry())
    for t in (add_one, double, flaky, explode, transfer):
        executor.register_tool(t)
    register = executor.registry.register_flow
    register(Flow("three", "three steps", [FlowStep("add_one", id="first"),
                                           FlowStep("double"),
                                           FlowStep("add_one", id="last")]))
    register(Flow("retrying", "a retried step", [
        FlowStep("flaky", retry=RetryPolicy(max_attempts=3, backoff_seconds=0,
                                            retry_on=("ConnectionError",)))]))
    register(Flow("failing", "fails in step 2", [FlowStep("add_one"), FlowStep("explode"),
                                                  FlowStep("double")]))
    register(Flow("paying", "needs approval", [FlowStep("add_one"), FlowStep("transfer")]))
    return executor


def test_observer_sees_every_step_in_both_lanes_alike(executor: FlowExecutor) -> None:
    sync, asynchronous = Recorder(), Recorder()
    first = executor.execute_flow("three", {"n": 1}, observer=sync)
    second = asyncio.run(executor.execute_flow_async("three", {"n": 1}, observer=asynchronous))
    assert first.final_output == second.final_output == {"n": 5}
    assert sync.events == asynchronous.events == [
        ("run_started", "three", 3),
        ("started", "first", "running"), ("finished", "first", "completed"),
        ("started", "double", "running"), ("finished", "double", "completed"),
        ("started", "last", "running"), ("finished", "last", "completed"),
        ("run_finished", True, None)]


def test_observer_sees_retries_and_failures(executor: FlowExecutor) -> None:
    retried = Recorder()
    assert executor.execute_flow("retrying", {"n": 1}, observer=retried).success
    assert ("retrying", "flaky", "ConnectionError") in retried.events
    failed = Recorder()
    result = asyncio.run(executor.execute_flow_async("failing", {"n": 1}, observer=failed))
    assert not result.success
    assert failed.events[-2:] == [("finished", "explode", "failed"),
                                  ("run_finished", False, "RuntimeError")]


def test_invalid_input_reports_no_start(executor: FlowExecutor) -> None:
    observer = Recorder()
    result = executor.execute_flow("three", {"n": "x"}, observer=observer)
    assert result.error.type == "InputValidationError"
    assert observer.events == [("run_finished", False, "InputValidationError")]


class Broken(RunObserver):
    def step_started(self, record: Any) -> None:
        raise ValueError("observer bug")


def test_a_broken_observer_never_breaks_the_run(executor: FlowExecutor) -> None:
    result = executor.execute_flow("three", {"n": 1}, observer=Broken())
    assert result.final_output == {"n": 5}


def test_no_observer_gives_the_same_result_and_records(executor: FlowExecutor) -> None:
    plain = executor.execute_flow("three", {"n": 1})
    observed = executor.execute_flow("three", {"n": 1}, observer=Recorder())
    assert [(r.step_id, r.status, r.outputs) for r in plain.steps] == \
        [(r.step_id, r.status, r.outputs) for r in observed.steps]


# ------------------------------------------------------------------ cancellation


def cancel_flow(executor: FlowExecutor, started: asyncio.Event,
                later: list[str]) -> None:
    @tool(safety=READ)
    async def wait_forever(value: Number) -> Number:
        started.set()
        await asyncio.sleep(60)
        return value

    @tool(safety=READ)
    def record_later(value: Number) -> Number:
        later.append("ran")
        return value

    executor.register_tool(wait_forever)
    executor.register_tool(record_later)
    executor.registry.register_flow(Flow("stoppable", "cancelled mid-way", [
        FlowStep("add_one"), FlowStep("wait_forever"), FlowStep("record_later")]))


def test_cancellation_stops_an_async_run_at_once(executor: FlowExecutor) -> None:
    later: list[str] = []

    async def scenario() -> Any:
        started = asyncio.Event()
        cancel_flow(executor, started, later)
        cancel = Cancellation()
        observer = Recorder()
        run = asyncio.ensure_future(executor.execute_flow_async(
            "stoppable", {"n": 1}, cancel=cancel, observer=observer))
        await asyncio.wait_for(started.wait(), 10)
        # From another thread, as a server's cancellation may arrive.
        threading.Thread(target=cancel.cancel).start()
        return await asyncio.wait_for(run, 10), observer

    result, observer = asyncio.run(scenario())
    assert not result.success and result.error.type == "CancelledError"
    assert result.error.step_id == "wait_forever"
    assert [(r.step_id, r.status) for r in result.steps] == [
        ("add_one", "completed"), ("wait_forever", "cancelled")]
    assert later == []  # no later step started
    assert ("finished", "wait_forever", "cancelled") in observer.events


def test_a_step_cancelled_or_timed_out_records_how_long_it_ran(
        executor: FlowExecutor) -> None:
    # A step stopped while running keeps the time it ran, not 0 ms: a run record that
    # says "cancelled after 0 ms" hides a step that held its resource for seconds.
    async def scenario() -> tuple[Any, Any]:
        started = asyncio.Event()
        cancel_flow(executor, started, [])
        cancel = Cancellation()
        run = asyncio.ensure_future(executor.execute_flow_async(
            "stoppable", {"n": 1}, cancel=cancel))
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(0.3)  # the step has been running at least this long
        cancel.cancel()
        cancelled = await asyncio.wait_for(run, 10)
        timed_out = await executor.execute_flow_async("stoppable", {"n": 1}, timeout=0.3)
        return cancelled, timed_out

    cancelled, timed_out = asyncio.run(scenario())
    stopped = cancelled.steps[-1]
    assert (stopped.step_id, stopped.status) == ("wait_forever", "cancelled")
    assert stopped.duration_ms >= 300
    assert timed_out.error.type == "TimeoutError"
    stuck = timed_out.steps[-1]
    assert (stuck.step_id, stuck.status) == ("wait_forever", "failed")
    # It ran from its start until the run's 0.3 s ran out (a margin for the clocks).
    assert stuck.started_ms + stuck.duration_ms >= 250


def test_cancelled_before_the_start_runs_nothing(executor: FlowExecutor) -> None:
    cancel = Cancellation()
    cancel.cancel()
    assert cancel.cancelled
    result = executor.execute_flow("three", {"n": 1}, cancel=cancel)
    assert result.error.type == "CancelledError" and result.steps == []
    result = asyncio.run(executor.execute_flow_async("three", {"n": 1}, cancel=cancel))
    assert result.error.type == "CancelledError" and result.steps == []


def test_sync_lane_stops_before_the_next_step(executor: FlowExecutor) -> None:
    cancel = Cancellation()

    class CancelAfterFirst(RunObserver):
        def step_finished(self, record: Any) -> None:
            cancel.cancel()

    result = executor.execute_flow("three", {"n": 1}, cancel=cancel,
                                   observer=CancelAfterFirst())
    assert [(r.step_id, r.status) for r in result.steps] == [("first", "completed")]
    assert result.error.type == "CancelledError"


def test_an_uncancelled_token_changes_nothing(executor: FlowExecutor) -> None:
    result = asyncio.run(executor.execute_flow_async("three", {"n": 1},
                                                     cancel=Cancellation(), timeout=10))
    assert result.final_output == {"n": 5}


def test_cancelling_the_awaiting_task_still_raises(executor: FlowExecutor) -> None:
    async def scenario() -> None:
        started = asyncio.Event()
        cancel_flow(executor, started, [])
        observer = Recorder()
        run = asyncio.ensure_future(executor.execute_flow_async(
            "stoppable", {"n": 1}, cancel=Cancellation(), observer=observer))
        await asyncio.wait_for(started.wait(), 10)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert ("finished", "wait_forever", "cancelled") in observer.events

    asyncio.run(scenario())


# ------------------------------------------------------------------ approval


def test_approval_request_covers_exactly_the_steps_that_need_it(
        executor: FlowExecutor) -> None:
    request = approval_request(executor.plan(executor.registry.get_flow("paying")))
    assert request == ApprovalRequest("paying", "1.0.0", (
        CoveredStep("transfer", "transfer", "write", "moves money", 1),))
    # The first covered step's fields, as a request held before it listed them all.
    assert (request.step_id, request.step_index, request.tool_name, request.side_effects,
            request.reason) == ("transfer", 1, "transfer", "write", "moves money")
    assert approval_request(executor.plan(executor.registry.get_flow("three"))) is None


@pytest.mark.parametrize("answer", [True, False, "yes", None])
def test_approval_is_awaited_before_any_step(executor: FlowExecutor, answer: Any) -> None:
    asked: list[ApprovalRequest] = []

    async def approve(request: ApprovalRequest) -> Any:
        asked.append(request)
        assert SIDE_EFFECTS == []
        return answer

    result = asyncio.run(executor.execute_flow_async("paying", {"n": 1}, approve=approve))
    assert [r.step_id for r in asked] == ["transfer"]
    if answer is True:
        assert result.success and SIDE_EFFECTS == [2]
    else:
        assert result.error.type == "ApprovalDenied" and result.error.step_id == "transfer"
        assert "moves money" in result.error.message
        assert result.steps == [] and SIDE_EFFECTS == []


def test_a_raising_approval_hook_refuses(executor: FlowExecutor) -> None:
    async def approve(request: ApprovalRequest) -> bool:
        raise RuntimeError("hook bug")

    result = asyncio.run(executor.execute_flow_async("paying", {"n": 1}, approve=approve))
    assert result.error.type == "ApprovalDenied" and "RuntimeError" in result.error.message
    assert SIDE_EFFECTS == []


def test_approval_not_asked_for_invalid_input_or_flows_without_need(
        executor: FlowExecutor) -> None:
    asked: list[ApprovalRequest] = []

    async def approve(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True

    bad = asyncio.run(executor.execute_flow_async("paying", {"n": "x"}, approve=approve))
    fine = asyncio.run(executor.execute_flow_async("three", {"n": 1}, approve=approve))
    assert bad.error.type == "InputValidationError" and fine.success and asked == []


def test_a_flow_declaring_approval_puts_every_step_of_it_under_the_approval(
        executor: FlowExecutor) -> None:
    executor.registry.register_flow(Flow("declared", "declared", [FlowStep("add_one")],
                                         safety=WRITE_APPROVAL))
    request = approval_request(executor.plan(executor.registry.get_flow("declared")))
    # The tool's own side effects, the flow's reason.
    assert request is not None and request.steps == (
        CoveredStep("add_one", "add_one", "read", "moves money", 0),)
    executor.registry.register_flow(Flow("outer", "sub-flow", [FlowStep(flow="paying")]))
    inner = approval_request(executor.plan(executor.registry.get_flow("outer")))
    assert inner is not None and inner.step_ids == ("paying/transfer",)
    assert inner.step_index == 0 and inner.reason == "moves money"


def test_a_dag_gives_the_same_result_records_and_step_events_in_both_lanes(
        executor: FlowExecutor) -> None:
    executor.registry.register_flow(Flow("diamond", "two branches and a join", [
        FlowStep("add_one", id="a"),
        FlowStep("double", id="left", after=["a"]),
        FlowStep("add_one", id="right", after=["a"], output_mapping={"m": "n"}),
        FlowStep("double", id="join", after=["left", "right"])]))
    sync, asynchronous = Recorder(), Recorder()
    first = executor.execute_flow("diamond", {"n": 1}, observer=sync)
    second = asyncio.run(executor.execute_flow_async("diamond", {"n": 1},
                                                     observer=asynchronous))
    assert first.success and first.final_output == second.final_output
    assert [(r.step_id, r.status, r.outputs) for r in first.steps] == \
        [(r.step_id, r.status, r.outputs) for r in second.steps]
    # Branches may finish in any order in the async lane: the same events, as a set.
    assert sorted(map(str, sync.events)) == sorted(map(str, asynchronous.events))
    assert ("finished", "join", "completed") in sync.events
