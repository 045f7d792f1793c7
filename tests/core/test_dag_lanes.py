"""Both lanes agree after a failure, whatever the timing; cancellation and abandonment."""

from __future__ import annotations

import asyncio
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, tool


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
