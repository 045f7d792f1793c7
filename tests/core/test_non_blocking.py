"""Tools that never block skip the thread hop (issue 36, item 5).

``blocking=False`` (on ``Tool`` and ``@tool``) is an explicit opt-in: such a sync tool
runs on the event loop in ``execute_flow_async``. Every other sync tool keeps running
in a worker thread. A step that waits (a timeout, a retry's backoff) or has a blocking
fallback still runs off the loop.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import BaseModel

from chainweaver import (
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    Tool,
    ToolSafetyContract,
    tool,
)


class Value(BaseModel):
    x: int


where: list[tuple[str, bool]] = []


def on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def noted(name: str):  # type: ignore[no-untyped-def]
    def fn(model: Value) -> dict:
        where.append((name, on_loop()))
        return {"x": model.x + 1}
    return fn


def executor_with(*tools: Tool, steps: list[FlowStep] | None = None) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    for t in tools:
        executor.register_tool(t)
    executor.registry.register_flow(Flow("f", "A flow.", steps or [
        FlowStep(t.name) for t in tools]))
    return executor


@pytest.fixture(autouse=True)
def fresh() -> None:
    where.clear()


def run(executor: FlowExecutor) -> int:
    result = asyncio.run(executor.execute_flow_async("f", {"x": 0}))
    assert result.success, result.error
    return result.final_output["x"]  # type: ignore[index]


def test_a_non_blocking_tool_runs_on_the_event_loop_and_a_default_one_off_it() -> None:
    free = Tool("free", "Quick.", Value, Value, noted("free"), blocking=False)
    default = Tool("default", "Default.", Value, Value, noted("default"))
    assert run(executor_with(free)) == 1
    assert run(executor_with(default)) == 1
    assert run(executor_with(free, default)) == 2
    assert run(executor_with(default, free)) == 2
    assert where == [("free", True), ("default", False),
                     ("free", True), ("default", False),
                     ("default", False), ("free", True)]


def test_the_tool_decorator_takes_the_opt_in() -> None:
    @tool(blocking=False)
    def quick(model: Value) -> Value:
        where.append(("quick", on_loop()))
        return Value(x=model.x + 1)

    @tool
    def plain(model: Value) -> Value:
        where.append(("plain", on_loop()))
        return Value(x=model.x + 1)

    assert quick.blocking is False and plain.blocking is True
    assert run(executor_with(quick, plain)) == 2
    assert where == [("quick", True), ("plain", False)]


def test_a_step_that_waits_runs_a_non_blocking_tool_off_the_loop() -> None:
    free = Tool("free", "Quick.", Value, Value, noted("free"), blocking=False,
                safety=ToolSafetyContract("none", idempotent=True))
    assert run(executor_with(free, steps=[FlowStep("free", timeout=5)])) == 1
    assert where == [("free", False)]  # a timeout needs a thread it can abandon
    where.clear()
    retried = executor_with(free, steps=[FlowStep("free", retry=RetryPolicy(2))])
    assert run(retried) == 1
    assert where == [("free", True)]  # called on the loop; a backoff would be awaited


def test_a_blocking_fallback_keeps_the_step_off_the_loop() -> None:
    def broken(model: Value) -> dict:
        where.append(("broken", on_loop()))
        raise ValueError("no")

    free = Tool("free", "Quick.", Value, Value, broken, blocking=False)
    backup = Tool("backup", "Backup.", Value, Value, noted("backup"))
    executor = executor_with(free, backup, steps=[
        FlowStep("free", on_error="fallback", fallback="backup")])
    assert run(executor) == 1
    assert where == [("broken", False), ("backup", False)]


def test_sync_runs_are_unchanged_and_async_tools_ignore_the_flag() -> None:
    free = Tool("free", "Quick.", Value, Value, noted("free"), blocking=False)
    assert executor_with(free).execute_flow("f", {"x": 0}).final_output == {"x": 1}
    assert where == [("free", False)]

    async def waits(model: Value) -> dict:
        return {"x": model.x}

    assert Tool("waits", "Async.", Value, Value, waits, blocking=True).blocking is False


def test_blocking_must_be_a_bool() -> None:
    with pytest.raises(DefinitionError, match="blocking must be True or False"):
        Tool("free", "Quick.", Value, Value, noted("free"), blocking="no")  # type: ignore[arg-type]


def test_a_non_blocking_run_never_leaves_the_loops_thread() -> None:
    threads: list[int] = []

    def fn(model: Value) -> dict:
        threads.append(threading.get_ident())
        return {"x": model.x + 1}

    tools = [Tool(f"t{i}", "Quick.", Value, Value, fn, blocking=False) for i in range(3)]

    async def main() -> int:
        result = await executor_with(*tools).execute_flow_async("f", {"x": 0})
        assert result.final_output == {"x": 3}
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert threads == [loop_thread] * 3
