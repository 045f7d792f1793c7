"""A background task whose approval was given, resumed on another worker after its
worker died and the caller's grant changed (a delegation covers the step now): on a
real Redis with real worker processes, the resumed run does not take the old answer as
covering the new decision. It asks again before any further step runs, and once the
user approves again it resumes from its checkpoints.

This file is also the program the workers run (``python this_file.py REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from chainweaver import (
    Delegation,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)

pytestmark = [pytest.mark.slow, pytest.mark.tasks]

REDELIVERY = 2.0  # seconds before a dead worker's task may go to another worker
LIMIT = 60.0  # seconds: only stops a hang
POLL = 0.2
READ = ToolSafetyContract("read")
_CLIENT: dict[str, Any] = {}


def _redis() -> Any:
    if "client" not in _CLIENT:
        import redis.asyncio as redis

        _CLIENT["client"] = redis.Redis.from_url(os.environ["APPROVAL_REDIS"])
    return _CLIENT["client"]


class Order(BaseModel):
    order: str


@tool(safety=READ, requires=["orders.read"])
async def load(order: str) -> Order:
    await _redis().hincrby("approval:runs", "load", 1)
    return Order(order=order)


@tool(safety=READ)
async def crunch(order: str) -> Order:
    """Idempotent, and slow on its first execution: its worker is killed meanwhile."""
    if await _redis().hincrby("approval:runs", "crunch", 1) == 1:
        await _redis().set("approval:crunching", 1)
        await asyncio.sleep(LIMIT)
    return Order(order=order)


@tool(safety=ToolSafetyContract("write", requires_approval=True,
                                approval_reason="exports the order"),
      requires=["orders.export"])
async def export(order: str) -> Order:
    await _redis().hincrby("approval:runs", "export", 1)
    return Order(order=order)


async def _refresh(caller: Any) -> Any:
    from chainweaver.mcp import CallerIdentity

    revoked = {item.decode() for item in await _redis().smembers("approval:revoked")}
    return CallerIdentity(caller.id, caller.claims, subject=caller.subject,
                          scopes=caller.scopes - revoked)


def _authenticate(gate: Any) -> Any:
    from chainweaver.mcp import CallerIdentity

    return CallerIdentity("ann", {"sub": "ann"}, subject="ann",
                          scopes=frozenset({"orders.read", "orders.export"}))


def build(url: str, concurrency: int) -> Any:
    from chainweaver.mcp import ExposurePolicy, FlowServer, SecurityConfig, TaskSettings

    executor = FlowExecutor(FlowRegistry())
    for item in (load, crunch, export):
        executor.register_tool(item)
    executor.registry.register_flow(Flow(
        "export_order", "load, crunch, export", [FlowStep("load"), FlowStep("crunch"),
                                                 FlowStep("export")],
        delegations=[Delegation("export", "the export service runs it")]))
    return FlowServer(executor, tasks=TaskSettings(url=url, concurrency=concurrency,
                                                   redelivery_timeout=REDELIVERY),
                      policy=ExposurePolicy(allowed_side_effects=["read", "write"],
                                            approval="elicit"),
                      security=SecurityConfig(authenticator=_authenticate,
                                              refresh_caller=_refresh))


def _worker(url: str, log_path: Path) -> subprocess.Popen:
    with log_path.open("w") as log:
        return subprocess.Popen([sys.executable, __file__, url],
                                env={**os.environ, "APPROVAL_REDIS": url},
                                stdout=subprocess.DEVNULL, stderr=log)



def _question(requests: dict[str, Any]) -> str:
    (request,) = requests.values()
    return request["params"]["message"] if isinstance(request, dict) \
        else request.params.message


@pytest.mark.anyio
async def test_a_task_resumed_under_a_changed_grant_asks_its_approval_again(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.asyncio as redis
    from fastmcp_tasks import call_tool_task
    from support.polling import until  # here: worker processes import this file
    from support.task_asks import answering, reply, send_task_update

    url = redis_url.rsplit("/", 1)[0] + "/12"
    store = redis.Redis.from_url(url)
    await store.flushdb()
    monkeypatch.setenv("APPROVAL_REDIS", url)
    _CLIENT.clear()
    workers: list[subprocess.Popen] = []
    try:
        async with answering(build(url, 0)) as client:
            task = await call_tool_task(client, "export_order", {"order": "A-1"})
            workers.append(_worker(url, tmp_path / "worker-0.log"))
            first = (await task.wait(state="input_required", timeout=LIMIT)).input_requests
            assert "asks again" not in _question(first).lower()
            await send_task_update(client, task.task_id, reply(first, "accept",
                                                               {"approve": True}))
            await until(lambda: store.exists("approval:crunching"), "crunch running", LIMIT, POLL)
            # The caller's export grant is revoked (the flow's delegation still covers
            # the step), and the worker running the task dies.
            await store.sadd("approval:revoked", "orders.export")
            workers[0].send_signal(signal.SIGKILL)
            await asyncio.to_thread(workers[0].wait, 30)
            workers.append(_worker(url, tmp_path / "worker-1.log"))
            again = await until(lambda: _asked_again(task), "the approval asked again", LIMIT, POLL)
            runs_when_asked = await _runs(store)
            await send_task_update(client, task.task_id, reply(again, "accept",
                                                               {"approve": True}))
            result = await asyncio.wait_for(task.result(), LIMIT)
    finally:
        for process in workers:
            process.kill()
            process.wait(30)
    runs = await _runs(store)
    await store.aclose()
    assert _question(again).startswith("Asked again: the grant decisions of its steps "
                                       "changed since it was asked.")
    # Nothing ran on the old answer: the export waited for the new one.
    assert runs_when_asked == {"load": 1, "crunch": 1}
    assert not result.is_error, result
    # Resumed: load came from its checkpoint, crunch ran again, export ran once.
    assert runs == {"load": 1, "crunch": 2, "export": 1}


async def _asked_again(task: Any) -> dict[str, Any] | None:
    status = await task.status()
    if status.status != "input_required" or not status.input_requests:
        return None
    requests: dict[str, Any] = status.input_requests
    return requests if _question(requests).startswith("Asked again") else None


async def _runs(store: Any) -> dict[str, int]:
    return {key.decode(): int(count)
            for key, count in (await store.hgetall("approval:runs")).items()}


if __name__ == "__main__":  # a worker process: runs the tasks the replica enqueues
    os.environ.setdefault("APPROVAL_REDIS", sys.argv[1])
    build(sys.argv[1], 1).run_worker()
