"""Durable runs in the engine: checkpoints, resume, idempotency keys (in memory)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from chainweaver import (
    CheckpointMismatchError,
    CheckpointStoreError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    IdempotencyKey,
    MemoryCheckpointStore,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.checkpoints import INTERRUPTED

READ = ToolSafetyContract(SideEffectLevel.READ)
WRITE = ToolSafetyContract(SideEffectLevel.WRITE, idempotent=False)


class Crash(BaseException):
    """Stands in for a worker that dies mid-step (nothing catches it)."""


class N(BaseModel):
    n: int


def _build(crash_at: set[str]) -> tuple[FlowExecutor, Counter[str], list[str]]:
    calls: Counter[str] = Counter()
    keys: list[str] = []

    @tool(safety=READ)
    async def fetch(n: int) -> N:
        calls["fetch"] += 1
        return N(n=n + 1)

    @tool(name="left", safety=READ)
    async def left(n: int) -> dict:
        calls["left"] += 1
        return {"a": n * 2}

    @tool(name="right", safety=WRITE)
    async def right(n: int) -> dict:
        calls["right"] += 1
        if "right" in crash_at:
            raise Crash
        return {"b": n * 3}

    @tool(safety=WRITE)
    async def pay(a: int, b: int, key: IdempotencyKey) -> dict:
        calls["pay"] += 1
        keys.append(key)
        if "pay" in crash_at:
            crash_at.discard("pay")
            raise Crash
        return {"total": a + b}

    executor = FlowExecutor(FlowRegistry())
    for made in (fetch, left, right, pay):
        executor.register_tool(made)
    executor.registry.register_flow(Flow("order", "d", [
        FlowStep("fetch"), FlowStep("left", after=["fetch"]),
        FlowStep("right", after=["fetch"]), FlowStep("pay", after=["left", "right"])]))
    return executor, calls, keys


async def _crashing(executor: FlowExecutor, store: MemoryCheckpointStore,
                    run_id: str = "run-1") -> None:
    with pytest.raises(Crash):
        await executor.execute_flow_async("order", {"n": 1}, run_id=run_id,
                                          checkpoints=store)


def test_a_keyed_step_runs_again_with_the_same_key_and_completed_steps_do_not() -> None:
    executor, calls, keys = _build({"pay"})
    store = MemoryCheckpointStore()
    asyncio.run(_crashing(executor, store))
    result = asyncio.run(executor.execute_flow_async("order", {"n": 1}, run_id="run-1",
                                                     checkpoints=store))
    assert result.success and result.final_output == {"total": 10}
    assert calls == Counter(fetch=1, left=1, right=1, pay=2)
    assert len(keys) == 2 and keys[0] == keys[1]
    assert [(s.step_id, s.restored) for s in result.steps] == [
        ("fetch", True), ("left", True), ("right", True), ("pay", False)]


def test_an_interrupted_keyless_write_fails_the_run_and_nothing_runs_again() -> None:
    executor, calls, _ = _build({"right"})
    store = MemoryCheckpointStore()
    asyncio.run(_crashing(executor, store))
    before = dict(calls)
    result = asyncio.run(executor.execute_flow_async("order", {"n": 1}, run_id="run-1",
                                                     checkpoints=store))
    assert not result.success
    assert result.error is not None and result.error.type == INTERRUPTED
    assert result.error.step_id == "right"
    assert "interrupted while running a non-idempotent step" in result.error.message
    assert dict(calls) == before  # no step ran: not fetch, not left, not right


def test_keys_differ_across_runs_and_steps_and_never_reach_a_schema() -> None:
    executor, _, keys = _build(set())
    for run_id in ("a", "b"):
        asyncio.run(executor.execute_flow_async("order", {"n": 1}, run_id=run_id))
    assert len(set(keys)) == 2 and all(len(key) == 32 for key in keys)
    pay = executor.get_tool("pay")
    assert pay.takes_key and set(pay.input_schema.model_fields) == {"a", "b"}
    assert "key" not in str(pay.input_schema.model_json_schema())
    # A caller cannot pass one: the flow's input does not have it.
    assert "key" not in executor.plan(executor.registry.get_flow("order")).input_model \
        .model_fields  # type: ignore[union-attr]


def test_a_run_whose_input_or_plan_changed_refuses_to_resume() -> None:
    executor, _, _ = _build({"pay"})
    store = MemoryCheckpointStore()
    asyncio.run(_crashing(executor, store))
    with pytest.raises(CheckpointMismatchError, match="another input"):
        asyncio.run(executor.execute_flow_async("order", {"n": 2}, run_id="run-1",
                                                checkpoints=store))
    registry = executor.registry
    registry.register_flow(Flow("order", "d", [FlowStep("fetch")], version="2.0.0"))
    with pytest.raises(CheckpointMismatchError, match="not 'order' 2.0.0"):
        asyncio.run(executor.execute_flow_async("order", {"n": 1}, "2.0.0", run_id="run-1",
                                                checkpoints=store))


class ClosingStore(MemoryCheckpointStore):
    """A store that closes after ``saves`` writes (its process shutting down)."""

    def __init__(self, saves: int) -> None:
        super().__init__()
        self.saves = saves

    async def save(self, run_id: str, entries: Any) -> None:
        if self.saves <= 0:
            raise ConnectionError("closed")
        self.saves -= 1
        await super().save(run_id, entries)


def test_a_store_that_fails_stops_the_run_as_the_stores_error_and_it_resumes_later() -> None:
    executor, calls, _ = _build(set())
    store = ClosingStore(saves=1)  # fetch's checkpoint is kept; the next one fails
    with pytest.raises(CheckpointStoreError, match="could not save") as raised:
        asyncio.run(executor.execute_flow_async("order", {"n": 1}, run_id="run-1",
                                                checkpoints=store))
    assert isinstance(raised.value.__cause__, ConnectionError)
    store.saves = 99  # back
    result = asyncio.run(executor.execute_flow_async("order", {"n": 1}, run_id="run-1",
                                                     checkpoints=store))
    assert result.success and result.final_output == {"total": 10}
    assert calls["fetch"] == 1  # resumed after the step the store acknowledged


def test_checkpoints_need_a_run_id() -> None:
    executor, _, _ = _build(set())
    with pytest.raises(ValueError, match="run_id"):
        asyncio.run(executor.execute_flow_async("order", {"n": 1},
                                                checkpoints=MemoryCheckpointStore()))


def test_a_finished_run_started_again_runs_nothing_and_gives_the_same_output() -> None:
    executor, calls, _ = _build(set())
    store = MemoryCheckpointStore()
    first = asyncio.run(executor.execute_flow_async("order", {"n": 1}, run_id="r",
                                                    checkpoints=store))
    again = asyncio.run(executor.execute_flow_async("order", {"n": 1}, run_id="r",
                                                    checkpoints=store))
    assert first.final_output == again.final_output == {"total": 10}
    assert calls == Counter(fetch=1, left=1, right=1, pay=1)
    assert all(step.restored for step in again.steps)
