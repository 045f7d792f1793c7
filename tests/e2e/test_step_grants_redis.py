"""A task resumed after its worker died, under a caller whose grant changed meanwhile,
on a real Redis with real worker processes: the second worker asks ``refresh_caller``
before each step it runs, so the step needing the revoked grant never runs.

This file is also the program the workers run (``python this_file.py REDIS_URL``): the
server it builds has the same tools, flow and SecurityConfig as the test's replica.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool

pytestmark = [pytest.mark.slow, pytest.mark.tasks]

REDELIVERY = 2.0  # seconds before a dead worker's task may go to another worker
LIMIT = 60.0  # seconds: only stops a hang
POLL = 0.2
READ = ToolSafetyContract("read")
_CLIENT: dict[str, Any] = {}


def _redis() -> Any:
    if "client" not in _CLIENT:
        import redis.asyncio as redis

        _CLIENT["client"] = redis.Redis.from_url(os.environ["GRANTS_REDIS"])
    return _CLIENT["client"]


class Order(BaseModel):
    order: str


@tool(safety=READ, requires=["orders.read"])
async def load(order: str) -> Order:
    await _redis().hincrby("grants:runs", "load", 1)
    return Order(order=order)


@tool(safety=READ)
async def crunch(order: str) -> Order:
    """Idempotent, and slow on its first execution: its worker is killed meanwhile."""
    if await _redis().hincrby("grants:runs", "crunch", 1) == 1:
        await _redis().set("grants:crunching", 1)
        await asyncio.sleep(LIMIT)
    return Order(order=order)


@tool(safety=READ, requires=["orders.export"])
async def export(order: str) -> Order:
    await _redis().hincrby("grants:runs", "export", 1)
    return Order(order=order)


async def _refresh(caller: Any) -> Any:
    """The caller as the directory says it is now: scopes revoked since are gone. The
    directory knows a caller by its id, or by its subject (the test says which)."""
    from chainweaver.mcp import CallerIdentity

    by = (await _redis().get("grants:directory_key") or b"id").decode()
    who = caller.subject if by == "subject" else caller.id
    revoked = {item.decode() for item in await _redis().smembers(f"grants:revoked:{who}")}
    return CallerIdentity(caller.id, caller.claims, subject=caller.subject,
                          scopes=caller.scopes - revoked)


async def _audit(event: Any) -> None:
    if event.phase in ("step", "completed") and event.kind == "task":
        await _redis().rpush("grants:audit", json.dumps(
            {"phase": event.phase, "step_id": event.step_id, "reason": event.reason,
             "caller": event.caller_id, "status": event.task_status}))


def _authenticate(gate: Any) -> Any:
    from chainweaver.mcp import CallerIdentity

    return CallerIdentity("ann", {"sub": "ann-sub"}, subject="ann-sub",
                          scopes=frozenset({"orders.read", "orders.export"}))


def build(url: str, concurrency: int, checked: bool = True) -> Any:
    """The replica's (concurrency 0) or a worker's server; ``checked``: with the
    replica's refresh_caller (False: a worker configured without it)."""
    from chainweaver.mcp import FlowServer, SecurityConfig, TaskSettings

    executor = FlowExecutor(FlowRegistry())
    for item in (load, crunch, export):
        executor.register_tool(item)
    executor.registry.register_flow(Flow("export_order", "load, crunch, export", [
        FlowStep("load"), FlowStep("crunch"), FlowStep("export")]))
    return FlowServer(executor, tasks=TaskSettings(url=url, concurrency=concurrency,
                                                   redelivery_timeout=REDELIVERY),
                      security=SecurityConfig(authenticator=_authenticate,
                                              refresh_caller=_refresh if checked else None,
                                              audit_hook=_audit))


def _worker(url: str, log_path: Path) -> subprocess.Popen:
    with log_path.open("w") as log:
        return subprocess.Popen([sys.executable, __file__, url],
                                env={**os.environ, "GRANTS_REDIS": url},
                                stdout=subprocess.DEVNULL, stderr=log)



@pytest.mark.anyio
@pytest.mark.parametrize("directory_key", ["id", "subject"])
async def test_a_task_resumed_after_its_worker_died_asks_for_the_grant_as_it_is_now(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        directory_key: str) -> None:
    # The directory refresh_caller asks may know the caller by its subject: the resumed
    # leg must show it the task's caller whole (its subject was lost, so the revocation
    # was never found and the export ran).
    import redis.asyncio as redis
    from fastmcp import Client
    from fastmcp_tasks import call_tool_task
    from support.polling import until  # here: worker processes import this file

    url = redis_url.rsplit("/", 1)[0] + "/13"
    store = redis.Redis.from_url(url)
    await store.flushdb()
    await store.set("grants:directory_key", directory_key)
    monkeypatch.setenv("GRANTS_REDIS", url)
    _CLIENT.clear()
    workers: list[subprocess.Popen] = []
    try:
        async with Client(build(url, 0).fastmcp) as client:
            task = await call_tool_task(client, "export_order", {"order": "A-1"},
                                        raise_on_error=False)
            workers.append(_worker(url, tmp_path / "worker-0.log"))
            await until(lambda: store.exists("grants:crunching"), "crunch running", LIMIT, POLL)
            # The caller's export grant is revoked while its task is under way, and the
            # worker running it dies.
            await store.sadd(f"grants:revoked:{'ann' if directory_key == 'id' else 'ann-sub'}",
                             "orders.export")
            workers[0].send_signal(signal.SIGKILL)
            await asyncio.to_thread(workers[0].wait, 30)
            workers.append(_worker(url, tmp_path / "worker-1.log"))
            result = await asyncio.wait_for(task.result(), LIMIT)
    finally:
        for process in workers:
            process.kill()
            process.wait(30)
    runs = {key.decode(): int(count)
            for key, count in (await store.hgetall("grants:runs")).items()}
    audit = [json.loads(item) for item in await store.lrange("grants:audit", 0, -1)]
    await store.aclose()
    assert result.is_error, result
    assert "StepRefused" in " ".join(getattr(c, "text", "") for c in result.content)
    # Resumed: load came from its checkpoint, crunch ran again, export never ran.
    assert runs == {"load": 1, "crunch": 2}
    assert [(e["step_id"], e["reason"], e["caller"]) for e in audit
            if e["phase"] == "step"] == [("export", "missing_grant", "ann")]
    assert "failed at step 'export': StepRefused" in (tmp_path / "worker-1.log").read_text()


@pytest.mark.anyio
async def test_a_worker_without_the_replica_s_refresh_caller_does_not_run_its_task(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The replica checks every step against the caller as it is now; a worker built
    # without refresh_caller would run the task for the caller as it was when the task
    # was created (its revoked grant included): it refuses to run it, as a worker that
    # would not ask for approval does.
    import redis.asyncio as redis
    from fastmcp import Client
    from fastmcp_tasks import call_tool_task

    url = redis_url.rsplit("/", 1)[0] + "/12"
    store = redis.Redis.from_url(url)
    await store.flushdb()
    monkeypatch.setenv("GRANTS_REDIS", url)
    _CLIENT.clear()
    await store.sadd("grants:revoked:ann", "orders.export")
    await store.hset("grants:runs", "crunch", 1)  # crunch does not stall this time
    worker = asyncio.create_task(build(url, 1, checked=False).run_worker_async())
    try:
        async with Client(build(url, 0).fastmcp) as client:
            task = await call_tool_task(client, "export_order", {"order": "A-2"},
                                        raise_on_error=False)
            done = await task.wait(timeout=LIMIT)
    finally:
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker
    runs = {key.decode(): int(count)
            for key, count in (await store.hgetall("grants:runs")).items()}
    await store.aclose()
    _CLIENT.clear()
    assert done.status == "failed"
    assert done.status_message == (
        "the steps of flow 'export_order' are checked by refresh_caller where the task "
        "was created, but not on this worker (give it the same SecurityConfig); the task "
        "did not run")
    assert runs == {"crunch": 1}  # no step ran: the export above all


if __name__ == "__main__":  # a worker process: runs the tasks the replica enqueues
    os.environ.setdefault("GRANTS_REDIS", sys.argv[1])
    build(sys.argv[1], 1).run_worker()
