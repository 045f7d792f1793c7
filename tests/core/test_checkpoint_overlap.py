"""A rerunnable step's checkpoint is written while the steps after it run; nothing that
must not run twice ever depends on a checkpoint still on its way.

What a process that dies at each point replays (linear flows, each step using the
previous one's output; "dies" = the run's task cancelled, its store keeping only what it
acknowledged):

- rerunnable A's checkpoint not yet stored while rerunnable B runs: A and B run again;
- rerunnable A's checkpoint not yet stored before non-rerunnable B: B does not start
  until it is stored and B's marker after it; dying meanwhile replays A, never B;
- non-rerunnable A's checkpoint not yet stored: B does not start (as before: dying
  then finds A's marker, and the run fails as interrupted, running nothing);
- a write that fails stops the run as the store's error (CheckpointStoreError), even
  when it was written behind a later step.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping

import pytest
from pydantic import BaseModel

from chainweaver import (
    CheckpointStoreError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    MemoryCheckpointStore,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.checkpoints import INTERRUPTED

READ = ToolSafetyContract(SideEffectLevel.READ)
WRITE = ToolSafetyContract(SideEffectLevel.WRITE, idempotent=False)
LIMIT = 10.0  # seconds: only stops a hang


class N(BaseModel):
    n: int


class HeldStore(MemoryCheckpointStore):
    """Acknowledges a write of ``held`` (a step's checkpoint) only once released;
    ``fail`` makes that write fail instead."""

    def __init__(self, held: str | None = None, fail: bool = False) -> None:
        super().__init__()
        self.held = held
        self.fail = fail
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()

    async def save(self, run_id: str, entries: Mapping[str, bytes]) -> None:
        if self.held is not None and f"done:{self.held}" in entries:
            self.waiting.set()
            await self.release.wait()
            if self.fail:
                raise ConnectionError("the store closed")
        await super().save(run_id, entries)


def build(first_safety: ToolSafetyContract, second_safety: ToolSafetyContract
          ) -> tuple[FlowExecutor, Counter[str], dict[str, asyncio.Event]]:
    calls: Counter[str] = Counter()
    events = {"second": asyncio.Event(), "go": asyncio.Event()}

    @tool(name="first", safety=first_safety)
    async def first(n: int) -> N:
        calls["first"] += 1
        return N(n=n + 1)

    @tool(name="second", safety=second_safety)
    async def second(n: int) -> N:
        calls["second"] += 1
        events["second"].set()
        await events["go"].wait()
        return N(n=n * 10)

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(first)
    executor.register_tool(second)
    executor.registry.register_flow(Flow("pair", "d", [FlowStep("first"),
                                                       FlowStep("second")]))
    return executor, calls, events


def start(executor: FlowExecutor, store: MemoryCheckpointStore) -> asyncio.Future[object]:
    """The run (always the same one: a new delivery of it resumes it), under way."""
    return asyncio.ensure_future(executor.execute_flow_async(
        "pair", {"n": 1}, run_id="run-1", checkpoints=store))


async def resumed(executor: FlowExecutor, store: MemoryCheckpointStore) -> object:
    return await asyncio.wait_for(start(executor, store), LIMIT)


async def die(run: asyncio.Future[object]) -> None:
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)


@pytest.mark.anyio
async def test_a_rerunnable_steps_checkpoint_is_written_while_the_next_step_runs() -> None:
    executor, calls, events = build(READ, READ)
    store = HeldStore(held="first")
    run = start(executor, store)
    # The second step starts while the first one's checkpoint is not stored yet.
    await asyncio.wait_for(events["second"].wait(), LIMIT)
    assert store.waiting.is_set() and not store.release.is_set()
    await die(run)
    # Nothing of the first step was stored: a new delivery runs both steps again.
    assert "done:first" not in await store.load("run-1")
    store.held = None
    events["go"].set()
    result = await resumed(executor, store)
    assert result.success and result.final_output == {"n": 20}  # type: ignore[attr-defined]
    assert calls == Counter(first=2, second=2)
    assert [s.restored for s in result.steps] == [False, False]  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_run_returns_only_once_its_checkpoints_are_stored() -> None:
    executor, calls, events = build(READ, READ)
    events["go"].set()
    store = HeldStore(held="second")  # the last step's checkpoint
    run = start(executor, store)
    await asyncio.wait_for(store.waiting.wait(), LIMIT)
    await asyncio.sleep(0.05)
    assert not run.done()  # the run waits for its last checkpoint
    store.release.set()
    result = await asyncio.wait_for(run, LIMIT)
    assert result.success
    again = await resumed(executor, store)  # everything comes from checkpoints
    assert [s.restored for s in again.steps] == [True, True]  # type: ignore[attr-defined]
    assert calls == Counter(first=1, second=1)


@pytest.mark.anyio
async def test_a_step_that_must_not_run_twice_waits_for_every_earlier_checkpoint(
        ) -> None:
    executor, calls, events = build(READ, WRITE)
    store = HeldStore(held="first")
    run = start(executor, store)
    await asyncio.wait_for(store.waiting.wait(), LIMIT)
    await asyncio.sleep(0.05)
    assert not events["second"].is_set()  # not before the first one's checkpoint
    await die(run)
    # Dying here replays the first step only; the second never ran, nor is it marked.
    assert await store.load("run-1") == {}
    store.held = None
    events["go"].set()
    result = await resumed(executor, store)
    assert result.success and calls == Counter(first=2, second=1)


@pytest.mark.anyio
async def test_a_non_rerunnable_steps_checkpoint_is_stored_before_its_dependents_start(
        ) -> None:
    executor, calls, events = build(WRITE, READ)
    store = HeldStore(held="first")
    run = start(executor, store)
    await asyncio.wait_for(store.waiting.wait(), LIMIT)
    await asyncio.sleep(0.05)
    assert not events["second"].is_set()
    await die(run)
    # Its marker was stored before it ran, its checkpoint was not: interrupted.
    store.held = None
    events["go"].set()
    result = await resumed(executor, store)
    assert not result.success and result.error.type == INTERRUPTED  # type: ignore[attr-defined]
    assert calls == Counter(first=1)


@pytest.mark.anyio
async def test_a_write_that_fails_behind_a_later_step_stops_the_run_as_the_stores_error(
        ) -> None:
    executor, calls, events = build(READ, READ)
    store = HeldStore(held="first", fail=True)
    run = start(executor, store)
    await asyncio.wait_for(events["second"].wait(), LIMIT)
    store.release.set()
    events["go"].set()
    with pytest.raises(CheckpointStoreError, match="could not save"):
        await asyncio.wait_for(run, LIMIT)
