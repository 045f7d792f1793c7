"""The async lane's worker threads (chainweaver.engine.calling.WorkerThreads): sync tools hop
to them and back; at most ``max_threads`` exist; a call cancelled before a thread took
it is never made; a loop that closed before a call ended does not cost the thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, Tool, ToolSafetyContract
from chainweaver.engine.calling import WorkerThreads

PURE = ToolSafetyContract("none")


class Number(BaseModel):
    n: int


def settle(threads: WorkerThreads) -> None:
    for _ in range(500):  # a bound that only stops a hang
        if not threads.busy():
            return
        time.sleep(0.01)
    raise AssertionError("a worker thread never finished its call")


def test_results_and_errors_come_back_from_the_thread() -> None:
    threads = WorkerThreads(2)

    def boom() -> None:
        raise KeyError("nope")

    async def main() -> None:
        assert await threads.run(threading.current_thread) is not threading.current_thread()
        assert await threads.run(sum, (1, 2, 3)) == 6
        with pytest.raises(KeyError, match="nope"):
            await threads.run(boom)

    asyncio.run(main())
    settle(threads)


def test_an_executor_uses_no_more_threads_than_max_threads() -> None:
    seen: set[str] = set()
    inside = threading.Semaphore(0)
    release = threading.Event()

    def hold(model: Number) -> dict:
        seen.add(threading.current_thread().name)
        inside.release()
        release.wait(10)
        return {"n": model.n}

    executor = FlowExecutor(FlowRegistry(), max_threads=2)
    executor.register_tool(Tool("hold", "Hold a thread.", Number, Number, hold, PURE))
    executor.registry.register_flow(Flow("one", "One step.", [FlowStep("hold")]))

    async def main() -> list[bool]:
        runs = [asyncio.ensure_future(executor.execute_flow_async("one", {"n": n}))
                for n in range(4)]
        for _ in range(2):  # two threads are inside; the other runs wait for one
            assert await asyncio.to_thread(inside.acquire, True, 10)
        assert not await asyncio.to_thread(inside.acquire, True, 0.2)
        release.set()
        return [result.success for result in await asyncio.gather(*runs)]

    assert asyncio.run(main()) == [True] * 4
    assert len(seen) == 2
    settle(executor._lanes.threads)


def test_a_call_cancelled_before_a_thread_took_it_is_not_made() -> None:
    threads = WorkerThreads(1)
    release = threading.Event()
    made: list[str] = []

    async def main() -> None:
        first = threads.run(release.wait, 10)
        second = threads.run(made.append, "second")  # queued: the only thread is busy
        second.cancel()
        release.set()
        assert await first is True
        assert await threads.run(made.append, "third") is None

    asyncio.run(main())
    assert made == ["third"]
    settle(threads)


def test_a_closed_loop_does_not_cost_the_thread() -> None:
    threads = WorkerThreads(1)
    release = threading.Event()

    async def abandon() -> None:
        threads.run(release.wait, 10)  # never awaited: the loop closes first

    asyncio.run(abandon())
    release.set()
    settle(threads)  # the call ended; its result had no loop to go to

    async def again() -> int:
        return await threads.run(len, "four")

    assert asyncio.run(again()) == 4  # the same single thread serves the next call
    settle(threads)


def test_a_backoff_in_a_worker_thread_ends_when_the_run_does() -> None:
    """The stop signal makes its event only when a step sleeps on it; set after that,
    it still wakes the sleeping step at once (a 30 s backoff would outlast settle())."""
    from chainweaver import RetryPolicy

    attempts: list[int] = []

    def flaky(model: Number) -> dict:
        attempts.append(model.n)
        raise ConnectionError("busy")

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(Tool("flaky", "Fails.", Number, Number, flaky, PURE))
    executor.registry.register_flow(Flow("f", "Retries.", [
        FlowStep("flaky", retry=RetryPolicy(3, backoff_seconds=30))]))
    result = asyncio.run(executor.execute_flow_async("f", {"n": 1}, timeout=0.2))
    assert result.error is not None and result.error.type == "TimeoutError"
    settle(executor._lanes.threads)
    assert attempts == [1]  # woken from its backoff, it made no second attempt
