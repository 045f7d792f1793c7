"""A task's status is its latest one: steps that start while an earlier status is still
being written do not each write theirs (each write is a round trip to the task
backend), only the message is written (tasks/get shows nothing else), and the last
step's status always lands."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from chainweaver.mcp.tasks.runner import _StepReports
from chainweaver.results import StepRecord


class StatusLog:
    """Stands in for the task's status writes (``write_status``): keeps the messages
    written, in order; each write takes a moment, as it would on Redis."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    async def write(self, message: str) -> None:
        await asyncio.sleep(0.01)
        self.writes.append(message)


def record(number: int) -> StepRecord:
    return StepRecord(number - 1, f"tool{number}", step_id=f"s{number}")


@pytest.mark.anyio
async def test_steps_that_start_back_to_back_write_only_the_latest_status() -> None:
    log = StatusLog()
    reports = _StepReports(log.write)
    reports.run_started("flow", "1", 3)
    reports.show("running")
    await asyncio.sleep(0)  # "running" is being written
    for number in (1, 2, 3):  # all three start before that write ends
        reports.step_started(record(number))
    await reports.drain()
    assert log.writes == ["running", "step 3/3 s3"]


@pytest.mark.anyio
async def test_steps_with_time_between_them_write_each_status_message() -> None:
    log = StatusLog()
    reports = _StepReports(log.write)
    reports.run_started("flow", "1", 3)
    for number in (1, 2, 3):
        reports.step_started(record(number))
        await asyncio.sleep(0.05)  # the step runs longer than its status write
    await reports.drain()
    assert log.writes == ["step 1/3 s1", "step 2/3 s2", "step 3/3 s3"]


@pytest.mark.anyio
async def test_steps_in_worker_threads_end_on_the_last_status() -> None:
    log = StatusLog()
    reports = _StepReports(log.write)
    reports.run_started("flow", "1", 20)

    def steps() -> None:
        for number in range(1, 21):
            reports.step_started(record(number))

    thread = threading.Thread(target=steps)
    thread.start()
    await asyncio.to_thread(thread.join)
    await reports.drain()
    numbers: list[Any] = [int(write.split()[1].split("/")[0]) for write in log.writes]
    assert numbers == sorted(numbers) and numbers[-1] == 20
    assert len(numbers) < 20  # steps overtaken while a write was under way: not written
