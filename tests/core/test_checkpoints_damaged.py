"""Checkpoints a run cannot read: an entry damaged, edited by hand or written by another
release (in Redis, say) makes the run refuse to resume with
:class:`CheckpointMismatchError` naming the run and the entry, before any step runs.
Before, a step checkpointed with a status this release does not write counted as done
without its outputs, so the run succeeded with a step skipped and a wrong result; other
damage escaped as KeyError, AttributeError or UnicodeDecodeError (the second adversarial
pass of issue 32)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from chainweaver import (
    CheckpointMismatchError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    MemoryCheckpointStore,
    ToolSafetyContract,
    tool,
)


class Number(BaseModel):
    n: int


CALLS: list[str] = []


@tool(safety=ToolSafetyContract("read", idempotent=True))
def increment(x: Number) -> Number:
    CALLS.append("increment")
    return Number(n=x.n + 1)


@tool(safety=ToolSafetyContract("read", idempotent=True))
def double(x: Number) -> Number:
    CALLS.append("double")
    return Number(n=x.n * 2)


def executor() -> FlowExecutor:
    registry = FlowRegistry()
    flows = FlowExecutor(registry)
    flows.register_tool(increment)
    flows.register_tool(double)
    registry.register_flow(Flow("calc", "Increments, then doubles.",
                                [FlowStep("increment", id="inc"),
                                 FlowStep("double", id="dbl")]))
    return flows


def step(**fields: object) -> bytes:
    return json.dumps({"status": "completed", "outputs": {"n": 2}, "inputs": {"n": 1},
                       "attempts": 1, "fallback": None, "error": None, **fields}).encode()


DAMAGED = {
    "head not UTF-8": {"head": b"\xff\xfe"},
    "head not an object": {"head": b"[1]"},
    "step not JSON": {"done:inc": b"{oops"},
    "step not an object": {"done:inc": b"[1, 2]"},
    "step nested too deep": {"done:inc": b"[" * 100_000 + b"]" * 100_000},
    "no status": {"done:inc": json.dumps({"outputs": {"n": 2}}).encode()},
    "unknown status": {"done:inc": step(status="boom")},
    "failed status": {"done:inc": step(status="failed")},
    "outputs not an object": {"done:inc": step(outputs=[2])},
    "attempts not a count": {"done:inc": step(attempts="x")},
    "fallback not a name": {"done:inc": step(fallback=5)},
    "error of unknown shape": {"done:inc": step(status="skipped", error={"x": 1})},
}


@pytest.mark.anyio
@pytest.mark.parametrize("damage", list(DAMAGED), ids=list(DAMAGED))
async def test_a_run_never_resumes_from_a_checkpoint_it_cannot_read(damage: str) -> None:
    flows = executor()
    good = MemoryCheckpointStore()
    first = await flows.execute_flow_async("calc", {"n": 1}, run_id="run-1", checkpoints=good)
    assert first.success and first.final_output == {"n": 4}
    entries = dict(await good.load("run-1"))
    entries.pop("done:dbl")  # the run stopped after its first step
    entries.update(DAMAGED[damage])
    store = MemoryCheckpointStore()
    await store.save("run-1", entries)
    CALLS.clear()
    with pytest.raises(CheckpointMismatchError, match="run 'run-1': .* cannot be read"):
        await flows.execute_flow_async("calc", {"n": 1}, run_id="run-1", checkpoints=store)
    assert CALLS == []  # refused before any step ran


@pytest.mark.anyio
async def test_a_readable_checkpoint_still_resumes() -> None:
    flows = executor()
    store = MemoryCheckpointStore()
    await store.save("run-2", {})
    first = await flows.execute_flow_async("calc", {"n": 1}, run_id="run-2",
                                           checkpoints=store)
    entries = dict(await store.load("run-2"))
    entries.pop("done:dbl")
    resumed_store = MemoryCheckpointStore()
    await resumed_store.save("run-2", entries)
    CALLS.clear()
    resumed = await flows.execute_flow_async("calc", {"n": 1}, run_id="run-2",
                                             checkpoints=resumed_store)
    assert resumed.success and resumed.final_output == first.final_output == {"n": 4}
    assert CALLS == ["double"]  # the first step came from its checkpoint
