"""``tasks/cancel`` marks a run's record cancelled without losing what the run itself
records. The replica that takes the cancel and the worker running the run both write the
record: the replica's mark only ever lands on a record whose run has not finished, in
one step no save of the run's can come between (on Redis, a transaction), so the run's
own record (its steps, the step it stopped at, ``CancelledError``) is never replaced by
an older one. The operator's log gets one warning per run, naming that step; a caller's
bad arguments are logged at info."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastmcp import Client
from fastmcp_tasks import call_tool_task
from servers import task_tools
from support.polling import until

from chainweaver.mcp import ExposurePolicy, FlowServer
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.runs.recording import RunLog
from chainweaver.mcp.runs.records import MemoryRunStore, RunRecord, RunStore

from ..tasks.test_tasks import LIMIT
from ..tasks.test_tasks import executor as task_executor

pytestmark = pytest.mark.tasks  # fastmcp-tasks, and the Redis client
RUN = "0123456789abcdef01234567"
STEPS = [{"id": "fetch", "status": "completed", "attempts": 1},
         {"id": "enrich", "status": "cancelled", "attempts": 1}]


def running(run_id: str = RUN) -> RunRecord:
    now = time.time()
    return RunRecord(run_id, "report", "1.0.0", "report", "alice", int(now * 1e6), now,
                     task_id="t-1")


def as_the_run_ended(run_id: str = RUN) -> RunRecord:
    """The record the run itself saves when it is cancelled (its worker's)."""
    record = running(run_id)
    record.status, record.ended_at = "cancelled", time.time()
    record.steps = [dict(step) for step in STEPS]
    record.error_type, record.error_step = "CancelledError", "enrich"
    return record


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.slow)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[RunStore]:
    if request.param == "memory":
        yield MemoryRunStore()
        return
    from chainweaver.mcp.runs.redis_records import RedisRunStore

    redis = RedisRunStore(request.getfixturevalue("redis_url"),
                          prefix=f"cancel:{time.time_ns()}")
    try:
        yield redis
    finally:
        await redis.close()


@pytest.mark.anyio
async def test_cancel_marks_a_running_record_and_no_other(store: RunStore) -> None:
    await store.save(running(), new=True)
    marked = await store.cancel(RUN, 1234.5)
    assert marked is not None and (marked.status, marked.ended_at) == ("cancelled", 1234.5)
    stored = await store.get(RUN)
    assert stored is not None and (stored.status, stored.ended_at) == ("cancelled", 1234.5)
    assert await store.cancel(RUN, 9999.0) is None  # finished: left as it is
    assert (await store.get(RUN)).ended_at == 1234.5  # type: ignore[union-attr]
    other = "fedcba9876543210fedcba98"
    await store.save(as_the_run_ended(other), new=True)
    await store.save(dataclass_with(as_the_run_ended(other), status="completed"))
    assert await store.cancel(other, 1.0) is None
    assert (await store.get(other)).status == "completed"  # type: ignore[union-attr]
    for unknown in ("ffffffffffffffffffffffff", "not a run id", "*", ""):
        assert await store.cancel(unknown, 1.0) is None


def dataclass_with(record: RunRecord, **changes: Any) -> RunRecord:
    import dataclasses

    return dataclasses.replace(record, **changes)


@pytest.mark.anyio
async def test_a_finished_record_is_never_marked_over(store: RunStore) -> None:
    await store.save(running(), new=True)
    await store.save(as_the_run_ended())  # the run's own end came first
    await RunLog(RunHistory(), store).cancelled(RUN)
    kept = await store.get(RUN)
    assert kept is not None and kept.to_dict() == as_the_run_ended().to_dict() | {
        "seq": kept.seq, "started_at": kept.started_at, "ended_at": kept.ended_at}


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_runs_own_save_between_the_read_and_the_write_is_kept(
        redis_url: str) -> None:
    """The race a replica's cancel ran on Redis: it read the record while the run was
    running, the worker saved the run's end, and the replica wrote back what it had read
    (``"steps": []``, no error type). Here the worker's save lands in exactly that gap."""
    import redis as sync_redis

    from chainweaver.mcp.runs.redis_records import RedisRunStore

    prefix = f"cancel-race:{time.time_ns()}"
    worker = sync_redis.Redis.from_url(redis_url)

    class ReplicaStore(RedisRunStore):
        """Reads as the replica does; the first read of the record lets the worker's
        save of the run's end through before the replica goes on."""

        raced = False

        def _decoded(self, raw: bytes | None, caller: str | None, run_id: str) -> Any:
            if raw is not None and not self.raced:
                self.raced = True
                worker.set(self._key("run", run_id),
                           json.dumps(as_the_run_ended(run_id).to_dict()), keepttl=True)
            return super()._decoded(raw, caller, run_id)

    replica = ReplicaStore(redis_url, prefix=prefix)
    try:
        await replica.save(running(), new=True)
        await RunLog(RunHistory(), replica).cancelled(RUN)
        kept = await replica.get(RUN)
    finally:
        await replica.close()
        worker.close()
    assert replica.raced
    assert kept is not None
    assert (kept.status, kept.error_type, kept.error_step) == \
        ("cancelled", "CancelledError", "enrich")
    assert kept.steps == STEPS


@pytest.mark.anyio
async def test_a_cancelled_task_records_where_it_stopped_and_warns_once(
        caplog: pytest.LogCaptureFixture) -> None:
    task_tools.COUNTS.clear()
    task_tools.HOLD = asyncio.Event()
    caplog.set_level(logging.INFO, logger="chainweaver.mcp.runs")
    served = FlowServer(task_executor(), tasks="memory://", run_history=RunHistory(),
                        policy=ExposurePolicy(allowed_side_effects=["read", "write"]))
    try:
        async with Client(served.fastmcp) as client:
            task = await call_tool_task(client, "report", {"n": 1})

            async def enriching() -> bool:
                return task_tools.COUNTS["enrich"] == 1

            await until(enriching, "the enrich step", LIMIT)
            await task.cancel()

            async def recorded() -> Any:
                listing = await client.read_resource("chainweaver://runs")
                (run,) = json.loads(listing[0].text)["runs"]
                return run if run["error_type"] == "CancelledError" else None

            run = await until(recorded, "the run's own record", LIMIT)
            read = await client.read_resource(f"chainweaver://runs/{run['run_id']}")
            record = json.loads(read[0].text)
    finally:
        task_tools.HOLD = None
    assert (record["status"], record["error_type"], record["error_step"]) == \
        ("cancelled", "CancelledError", "enrich")
    assert [(s["id"], s["status"]) for s in record["steps"]] == \
        [("fetch", "completed"), ("enrich", "cancelled")]
    lines = [(r.levelno, r.getMessage()) for r in caplog.records
             if r.name == "chainweaver.mcp.runs" and run["run_id"] in r.getMessage()]
    warnings = [text for level, text in lines if level == logging.WARNING]
    assert warnings == [f"run {run['run_id']} of flow 'report' version 1.0.0 cancelled "
                        "at step 'enrich': CancelledError"], lines


@pytest.mark.anyio
async def test_bad_arguments_are_logged_at_info_and_say_before_any_step(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chainweaver.mcp.runs")
    served = FlowServer(task_executor(), run_history=RunHistory(),
                        policy=ExposurePolicy(allowed_side_effects=["read", "write"]))
    async with Client(served.fastmcp) as client:
        result = await client.call_tool("report", {"n": "not a number"},
                                        raise_on_error=False)
    assert result.is_error
    (line,) = [r for r in caplog.records if r.name == "chainweaver.mcp.runs"
               and "InputValidationError" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert line.getMessage().endswith("failed before any step: InputValidationError")


def test_only_refused_arguments_say_before_any_step(caplog: pytest.LogCaptureFixture) -> None:
    """A run without a history keeps no steps, so a failure with no step named says
    nothing of where it happened: only the flow's input is known to be checked first."""
    from chainweaver.mcp.runs.recording import log_unsuccessful

    caplog.set_level(logging.INFO, logger="chainweaver.mcp.runs")
    cancelled = dataclass_with(running(), status="cancelled", error_type="CancelledError")
    refused = dataclass_with(running(), status="failed", error_type="InputValidationError")
    log_unsuccessful(cancelled)
    log_unsuccessful(refused)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"run {RUN} of flow 'report' version 1.0.0 cancelled: "
                          "CancelledError"),
        (logging.INFO, f"run {RUN} of flow 'report' version 1.0.0 failed before any step: "
                       "InputValidationError")]
