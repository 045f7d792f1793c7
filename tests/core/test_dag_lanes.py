"""Both lanes agree after a failure, whatever the timing; cancellation and abandonment."""

from __future__ import annotations

import asyncio
import threading
import time

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


class Out(BaseModel):
    a: int | None = None
    b: int | None = None


def build(*tools, flows=()) -> tuple[FlowRegistry, FlowExecutor]:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for t in tools:
        executor.register_tool(t)
    for flow in flows:
        registry.register_flow(flow)
    return registry, executor


def outcome(result) -> tuple:
    error = (result.error.type, result.error.step_id) if result.error else None
    return result.success, error, [(r.step_id, r.status, r.error and r.error.type)
                                   for r in result.steps]


def test_after_a_failure_the_async_lane_runs_what_the_sync_lane_runs() -> None:
    # "slow" is held until "late" (after the failure in plan order) has failed: the async
    # lane must still run "validate" (earlier in plan order) and report its failure.
    state: dict[str, asyncio.Event] = {}

    @tool
    async def slow(x: int) -> dict:
        await state["late_done"].wait()
        return {"a": 1}

    @tool
    async def validate(a: int) -> dict:
        raise LookupError("record locked")

    @tool
    async def late(x: int) -> dict:
        state["late_done"].set()
        raise PermissionError("denied")

    flow = Flow("f", "", [FlowStep("slow"), FlowStep("validate"),
                          FlowStep("late", after=())], output_schema=Out)
    _, executor = build(slow, validate, late, flows=[flow])

    async def run_async():
        state["late_done"] = asyncio.Event()
        return await executor.execute_flow_async("f", {"x": 1})

    async_ = asyncio.run(run_async())
    state["late_done"] = asyncio.Event()
    state["late_done"].set()  # the sync lane runs "slow" first, on its own loop
    sync = executor.execute_flow("f", {"x": 1})
    expected = (False, ("LookupError", "validate"),
                [("slow", "completed", None), ("validate", "failed", "LookupError")])
    assert outcome(sync) == expected
    assert outcome(async_) == expected


def test_steps_after_the_failure_are_left_out_and_cancelled() -> None:
    finished = []

    @tool
    async def fails(x: int) -> dict:
        raise ValueError("boom")

    @tool
    async def slow(x: int) -> dict:
        await asyncio.sleep(30)  # cancelled long before: the run must not wait for it
        finished.append("slow")
        return {"b": 1}

    flow = Flow("f", "", [FlowStep("fails"), FlowStep("slow", after=())], output_schema=Out)
    _, executor = build(fails, slow, flows=[flow])
    expected = (False, ("ValueError", "fails"), [("fails", "failed", "ValueError")])
    assert outcome(executor.execute_flow("f", {"x": 1})) == expected
    assert outcome(asyncio.run(executor.execute_flow_async("f", {"x": 1}))) == expected
    assert finished == []


@pytest.mark.parametrize("with_other_branch", [False, True])
def test_no_retry_or_fallback_after_the_async_call_returned(with_other_branch) -> None:
    calls: list[str] = []
    released = threading.Event()

    @tool(safety=ToolSafetyContract("read"))
    def flaky(x: int) -> dict:
        calls.append("flaky")
        released.wait(30)  # still running when the run times out
        raise ConnectionError("busy")

    @tool(safety=ToolSafetyContract("write"))
    def charge_fallback(x: int) -> dict:
        calls.append("fallback")
        return {"a": 1}

    @tool
    async def other(x: int) -> dict:
        await asyncio.sleep(30)
        return {"b": 1}

    steps = [FlowStep("flaky", retry=RetryPolicy(4, backoff_seconds=0),
                      on_error="fallback", fallback="charge_fallback")]
    if with_other_branch:
        steps.append(FlowStep("other", after=()))
    _, executor = build(flaky, charge_fallback, other,
                        flows=[Flow("f", "", steps, output_schema=Out)])
    result = asyncio.run(executor.execute_flow_async("f", {"x": 1}, timeout=0.05))
    assert result.error.type == "TimeoutError"
    released.set()
    for _ in range(500):  # the abandoned step ends (a bound that only stops a hang)
        if not executor._lanes.threads.busy():
            break
        time.sleep(0.01)
    assert not executor._lanes.threads.busy()
    assert calls == ["flaky"]


@tool
async def cancels_itself(x: int) -> dict:
    inner = asyncio.ensure_future(asyncio.sleep(10))
    await asyncio.sleep(0)
    inner.cancel()
    await inner  # raises CancelledError: the tool's own, not the run's
    return {"a": 1}


@tool
def raises_cancelled(x: int) -> dict:
    raise asyncio.CancelledError()


@pytest.mark.parametrize("name", ["cancels_itself", "raises_cancelled"])
def test_a_tool_raising_cancelled_error_fails_its_step_in_both_lanes(name) -> None:
    _, executor = build(cancels_itself, raises_cancelled,
                        flows=[Flow("f", "", [FlowStep(name)])])
    for result in (executor.execute_flow("f", {"x": 1}),
                   asyncio.run(executor.execute_flow_async("f", {"x": 1}))):
        assert outcome(result) == (False, ("CancelledError", name),
                                   [(name, "failed", "CancelledError")])


def test_cancelling_the_caller_still_cancels_the_run() -> None:
    @tool
    async def forever(x: int) -> dict:
        await asyncio.sleep(30)
        return {"a": 1}

    _, executor = build(forever, flows=[Flow("f", "", [FlowStep("forever")])])

    async def main() -> None:
        task = asyncio.ensure_future(executor.execute_flow_async("f", {"x": 1}))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
