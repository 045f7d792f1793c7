"""Sub-flows: which version runs, pinned plans, and plan caching."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from pydantic import BaseModel

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    ToolSafetyContract,
    tool,
)
from chainweaver.plan import MAX_SUBFLOW_DEPTH

READ = ToolSafetyContract("read")


class Said(BaseModel):
    said: str


@tool(safety=READ)
def one(x: int) -> Said:
    return Said(said="one")


@tool(safety=READ)
def two(x: int) -> Said:
    return Said(said="two")


@tool(safety=ToolSafetyContract("destructive"))
def three(x: int) -> Said:
    return Said(said="three")


def build(*flows: Flow) -> tuple[FlowRegistry, FlowExecutor]:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for t in (one, two, three):
        executor.register_tool(t)
    for flow in flows:
        registry.register_flow(flow)
    return registry, executor


def child(tool_name: str, version: str, lifecycle: str = "active") -> Flow:
    return Flow("child", "", [FlowStep(tool_name)], version=version,
                governance=FlowGovernance(lifecycle))


PARENT = Flow("parent", "", [FlowStep(flow="child")])


@pytest.mark.parametrize("lifecycle", ["draft", "reviewed", "archived"])
def test_a_sub_flow_step_runs_the_latest_active_version(lifecycle) -> None:
    _, executor = build(child("one", "1.0.0"), child("two", "2.0.0", lifecycle), PARENT)
    assert executor.check_flow(PARENT) == []
    assert executor.execute_flow("parent", {"x": 1}).final_output == {"said": "one"}
    result = asyncio.run(executor.execute_flow_async("parent", {"x": 1}))
    assert result.final_output == {"said": "one"}


def test_a_sub_flow_without_an_active_version_makes_the_parent_invalid() -> None:
    _, executor = build(child("one", "1.0.0", "draft"), PARENT)
    assert executor.check_flow(PARENT) == [
        "step 0 ('child') uses flow 'child', which has no active version (only active "
        "flows run as sub-flows)"]
    result = executor.execute_flow("parent", {"x": 1})
    assert (result.error.type, result.error.step_id) == ("FlowNotFoundError", "child")


def test_a_pinned_plan_runs_as_compiled_whatever_was_registered_since() -> None:
    registry, executor = build(child("one", "1.0.0"), PARENT)
    pinned = executor.plan(PARENT)
    registry.register_flow(child("three", "2.0.0"))
    assert executor.execute_flow("parent", {"x": 1}).final_output == {"said": "three"}
    assert executor.execute_flow("parent", {"x": 1}, plan=pinned).final_output == \
        {"said": "one"}
    result = asyncio.run(executor.execute_flow_async("parent", {"x": 1}, plan=pinned))
    assert result.final_output == {"said": "one"}
    assert result.flow_version == "1.0.0"


def test_a_pinned_plan_must_be_of_the_named_flow() -> None:
    _, executor = build(child("one", "1.0.0"), PARENT)
    pinned = executor.plan(PARENT)
    with pytest.raises(ValueError, match="'parent'"):
        executor.execute_flow("child", {"x": 1}, plan=pinned)
    with pytest.raises(ValueError):
        executor.execute_flow("parent", {"x": 1}, "9.0.0", plan=pinned)
    with pytest.raises(TypeError):
        executor.execute_flow("parent", {"x": 1}, plan=PARENT)  # type: ignore[arg-type]
    assert executor.execute_flow("parent", {"x": 1}, "1.0.0", plan=pinned).success


def test_a_missing_sub_flow_registered_later_is_seen() -> None:
    registry, executor = build(PARENT)
    assert "unregistered flow 'child'" in executor.check_flow(PARENT)[0]
    registry.register_flow(child("one", "1.0.0"))
    assert executor.check_flow(PARENT) == []
    assert executor.execute_flow("parent", {"x": 1}).final_output == {"said": "one"}


def test_a_sub_flow_declaring_safety_cannot_make_its_tools_retryable() -> None:
    calls = []

    @tool(safety=ToolSafetyContract("destructive"))
    def wipe(x: int) -> Said:
        calls.append("wipe")
        raise ConnectionError("flaky after deleting")

    registry, executor = build()
    executor.register_tool(wipe)
    registry.register_flow(Flow("inner", "", [FlowStep("wipe")],
                                safety=ToolSafetyContract("read")))
    outer = registry.register_flow(Flow("outer", "", [
        FlowStep(flow="inner", retry=RetryPolicy(3, backoff_seconds=0))]))
    [problem] = executor.flow_problems(outer)
    assert (problem.kind, problem.step_id, problem.fatal) == (
        "RetryNotAllowedError", "inner", True)
    assert "not idempotent" in problem.message
    assert executor.execute_flow("outer", {"x": 1}).error.type == "RetryNotAllowedError"
    assert calls == []
    # What callers see of the flow stays its declared contract.
    assert executor.effective_safety(registry.get_flow("inner")) == ToolSafetyContract("read")


def test_a_sub_flow_of_idempotent_tools_may_be_retried() -> None:
    registry, executor = build(child("one", "1.0.0"))
    outer = registry.register_flow(Flow("outer", "", [
        FlowStep(flow="child", retry=RetryPolicy(2, backoff_seconds=0))]))
    assert executor.check_flow(outer) == []


@pytest.mark.parametrize("retry_on", ["TimeoutError", "OSError", "Exception"])
def test_retry_on_names_the_error_a_sub_flow_attempt_ended_with(retry_on) -> None:
    attempts = []

    @tool(safety=READ)
    async def stuck_once(x: int) -> Said:
        attempts.append(x)
        if len(attempts) % 2 == 1:
            await asyncio.Event().wait()  # never set: the step's timeout ends it
        return Said(said="late")

    registry, executor = build()
    executor.register_tool(stuck_once)
    registry.register_flow(Flow("slow_child", "", [FlowStep("stuck_once")]))
    registry.register_flow(Flow("p", "", [FlowStep(
        flow="slow_child", timeout=0.05,
        retry=RetryPolicy(2, backoff_seconds=0, retry_on=[retry_on]))]))
    for result in (executor.execute_flow("p", {"x": 1}),
                   asyncio.run(executor.execute_flow_async("p", {"x": 1}))):
        assert result.final_output == {"said": "late"}
        assert result.steps[0].attempts == 2
        assert [e.type for e in result.steps[0].attempt_errors] == ["TimeoutError"]


def test_retry_on_another_error_does_not_retry_a_sub_flow_timeout() -> None:
    @tool(safety=READ)
    async def stuck(x: int) -> Said:
        await asyncio.Event().wait()
        return Said(said="never")

    registry, executor = build()
    executor.register_tool(stuck)
    registry.register_flow(Flow("slow_child", "", [FlowStep("stuck")]))
    registry.register_flow(Flow("p", "", [FlowStep(
        flow="slow_child", timeout=0.05,
        retry=RetryPolicy(3, backoff_seconds=0, retry_on=["ValueError"]))]))
    result = executor.execute_flow("p", {"x": 1})
    assert (result.error.type, result.steps[0].attempts) == ("TimeoutError", 1)


def chain(depth: int) -> tuple[FlowRegistry, FlowExecutor]:
    """f0 calls the tool; f<i> runs f<i-1> as its one step."""
    registry, executor = build(Flow("f0", "", [FlowStep("one")]))
    for i in range(1, depth + 1):
        registry.register_flow(Flow(f"f{i}", "", [FlowStep(flow=f"f{i - 1}")]))
    return registry, executor


def test_sub_flows_nest_up_to_32_levels() -> None:
    registry, executor = chain(MAX_SUBFLOW_DEPTH)
    assert executor.check_flow(registry.get_flow(f"f{MAX_SUBFLOW_DEPTH}")) == []
    result = executor.execute_flow(f"f{MAX_SUBFLOW_DEPTH}", {"x": 1})
    assert result.final_output == {"said": "one"}
    result = asyncio.run(executor.execute_flow_async(f"f{MAX_SUBFLOW_DEPTH}", {"x": 1}))
    assert result.final_output == {"said": "one"}


@pytest.mark.parametrize("depth", [MAX_SUBFLOW_DEPTH + 1, 400])
def test_deeper_nesting_is_a_problem_not_a_recursion_error(depth) -> None:
    registry, executor = chain(depth)
    top = registry.get_flow(f"f{depth}")
    [problem] = executor.flow_problems(top)
    assert (problem.kind, problem.fatal) == ("InvalidSubFlowError", True)
    assert f"more than {MAX_SUBFLOW_DEPTH} sub-flow levels deep" in problem.message
    for result in (executor.execute_flow(top.name, {"x": 1}),
                   asyncio.run(executor.execute_flow_async(top.name, {"x": 1}))):
        assert result.error.type == "InvalidSubFlowError"
    assert executor.input_model(top) is None and executor.effective_safety(top) is None


def test_a_sub_flow_used_many_times_is_compiled_once() -> None:
    # Each level runs the one below twice: 2 ** 20 sub-flow steps in all.
    registry, executor = build(Flow("d0", "", [FlowStep("one")]))
    for i in range(1, 21):
        registry.register_flow(Flow(f"d{i}", "", [
            FlowStep(flow=f"d{i - 1}", id="a", output_mapping={"first": "said"}),
            FlowStep(flow=f"d{i - 1}", id="b", after=[]),
        ], output_schema=Said))
    top = registry.get_flow("d20")
    assert executor.check_flow(top) == []
    assert executor.plans_compiled == 21
    assert executor.effective_safety(top) == READ
    assert executor.effective_safety(top, declared=False) == READ


class Nothing(BaseModel):
    pass


@pytest.mark.parametrize("sync_tool", [False, True])
def test_max_concurrent_steps_bounds_the_whole_call_sub_flows_included(sync_tool) -> None:
    lock = threading.Lock()
    now = {"running": 0, "most": 0}

    def enter() -> None:
        with lock:
            now["running"] += 1
            now["most"] = max(now["most"], now["running"])

    def leave() -> None:
        with lock:
            now["running"] -= 1

    if sync_tool:
        @tool(name="work")
        def work(x: int) -> dict:
            enter()
            time.sleep(0.01)
            leave()
            return {}
    else:
        @tool(name="work")
        async def work(x: int) -> dict:
            enter()
            await asyncio.sleep(0.01)
            leave()
            return {}

    registry = FlowRegistry()
    executor = FlowExecutor(registry, max_concurrent_steps=3)
    executor.register_tool(work)
    registry.register_flow(Flow("leaf", "", [FlowStep("work", id=f"w{i}", after=())
                                             for i in range(6)], output_schema=Nothing))
    registry.register_flow(Flow("top", "", [FlowStep(flow="leaf", id=f"s{i}", after=())
                                            for i in range(6)], output_schema=Nothing))
    result = asyncio.run(executor.execute_flow_async("top", {"x": 1}))
    assert result.success and len(result.steps) == 6
    assert 1 <= now["most"] <= 3
