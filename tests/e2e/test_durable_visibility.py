"""What a durable task shows when its worker dies, on a real Redis with real
``chainweaver worker`` processes: ``tasks/get`` says the worker stopped (not its last
step, as if it still ran) until another worker picks the task up, and the run record
read over MCP says the task was delivered twice and which steps were restored.

This file is also the ``--tools`` module the workers load: every tool counts its
executions in Redis, where the test reads them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from chainweaver import SideEffectLevel, ToolSafetyContract, tool
from chainweaver.mcp.tasks.durable import HEARTBEAT_TTL, STOPPED

pytestmark = [pytest.mark.slow, pytest.mark.tasks]

REDELIVERY = 2.0  # seconds before a dead worker's task may go to another worker
LIMIT = 60.0  # seconds: only stops a hang
POLL = 0.2
READ = ToolSafetyContract(SideEffectLevel.READ)
FLOW = """name: visible_order
description: Load, crunch (slow the first time), finish.
steps:
  - {tool: load}
  - {tool: crunch, after: [load]}
  - {tool: finish, after: [crunch]}
"""
_CLIENT: dict[str, Any] = {}


def _redis() -> Any:
    if "client" not in _CLIENT:
        import redis.asyncio as redis

        _CLIENT["client"] = redis.Redis.from_url(os.environ["VISIBLE_REDIS"])
    return _CLIENT["client"]


class Loaded(BaseModel):
    base: int


class Crunched(BaseModel):
    total: int


class Done(BaseModel):
    n: int
    total: int


@tool(safety=READ)
async def load(n: int) -> Loaded:
    """Read the order."""
    await _redis().hincrby("visible:runs", "load", 1)
    return Loaded(base=n * 10)


@tool(safety=READ)
async def crunch(base: int) -> Crunched:
    """Idempotent, and slow on its first execution: its worker is killed meanwhile."""
    if await _redis().hincrby("visible:runs", "crunch", 1) == 1:
        await _redis().set("visible:crunching", 1)
        await asyncio.sleep(LIMIT)
    return Crunched(total=base + 1)


@tool(safety=READ)
async def finish(n: int, total: int) -> Done:
    """Wrap it up."""
    await _redis().hincrby("visible:runs", "finish", 1)
    return Done(n=n, total=total)


# --------------------------------------------------------------------------- test


def _worker(flows: Path, url: str, log_path: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "chainweaver", "worker", str(flows), "--tools",
               __file__, "--tasks", url, "--side-effects", "read",
               "--task-redelivery", str(REDELIVERY), "--run-history", url]
    with log_path.open("w") as log:
        return subprocess.Popen(command, env={**os.environ, "VISIBLE_REDIS": url},
                                stdout=subprocess.DEVNULL, stderr=log)


def _replica(flows: Path, url: str) -> Any:
    from chainweaver import FlowExecutor, FlowRegistry
    from chainweaver.files import find_flow_files, load_flows
    from chainweaver.mcp import FlowServer, RunHistory, ServingConfig, TaskSettings

    executor = FlowExecutor(FlowRegistry())
    for step in (load, crunch, finish):
        executor.register_tool(step)
    for flow in load_flows(find_flow_files([flows]), tools=executor.tools):
        executor.registry.register_flow(flow)
    return FlowServer(executor, tasks=TaskSettings(url=url, concurrency=0,
                                                   redelivery_timeout=REDELIVERY),
                      serving=ServingConfig(run_history=RunHistory(store=url)))


async def _until(probe: Callable[[], Awaitable[Any]], what: str,
                 tries: int = int(LIMIT / POLL)) -> Any:
    """Poll ``probe`` until it answers something true (at most ``tries`` times).

    Not ``support.polling.until``: worker processes import this file as their tools
    module, and ``support`` is not importable there."""
    for _ in range(tries):
        answer = await probe()
        if answer:
            return answer
        await asyncio.sleep(POLL)
    raise AssertionError(f"never saw {what}")


@pytest.mark.anyio
async def test_a_killed_worker_is_shown_and_its_run_says_delivered_twice(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.asyncio as redis
    from fastmcp import Client
    from fastmcp_tasks import call_tool_task

    url = redis_url.rsplit("/", 1)[0] + "/12"
    store = redis.Redis.from_url(url)
    await store.flushdb()
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "visible_order.flow.yaml").write_text(FLOW)
    monkeypatch.setenv("VISIBLE_REDIS", url)  # the replica's tools (never run there)
    workers: list[subprocess.Popen] = []
    try:
        async with Client(_replica(flows, url).fastmcp) as client:
            task = await call_tool_task(client, "visible_order", {"n": 4})
            workers.append(_worker(flows, url, tmp_path / "worker-0.log"))
            await _until(lambda: store.exists("visible:crunching"), "crunch running")

            async def shows(message: str) -> Any:
                status = await task.status()
                return status if status.status_message == message else None

            # Its live worker renews the heartbeat: past its TTL, still its step.
            await asyncio.sleep(HEARTBEAT_TTL + 1)
            running = await _until(lambda: shows("step 2/3 crunch"), "the running step")
            workers[0].send_signal(signal.SIGKILL)
            await asyncio.to_thread(workers[0].wait, 30)
            stopped = await _until(
                lambda: shows(f"{STOPPED} (last status: step 2/3 crunch)"),
                "the stopped worker")
            workers.append(_worker(flows, url, tmp_path / "worker-1.log"))
            end = await asyncio.wait_for(task.wait(timeout=LIMIT), LIMIT)
            runs = json.loads((await client.read_resource("chainweaver://runs"))[0].text)
            run_id = runs["runs"][0]["run_id"]
            record = json.loads(
                (await client.read_resource(f"chainweaver://runs/{run_id}"))[0].text)
    finally:
        for process in workers:
            process.kill()
            process.wait(30)
    executions = {key.decode(): int(count)
                  for key, count in (await store.hgetall("visible:runs")).items()}
    await store.aclose()
    # `chainweaver runs show`, in this process (its own event loop, so in a thread):
    # tests/cli/test_cli_runs_history.py runs the installed command.
    from support.cli import completed

    done = await asyncio.to_thread(completed, "runs", "show", run_id, "--store", url)
    assert done.returncode == 0, done.stderr
    shown = done.stdout

    assert running.status == stopped.status == "working"
    assert end.status == "completed"
    assert "resumes run" in (tmp_path / "worker-1.log").read_text()
    assert len(runs["runs"]) == 1
    assert record["status"] == "completed"
    assert record["task_id"] == task.task_id
    assert record["deliveries"] == 2
    steps = {step["id"]: step for step in record["steps"]}
    assert list(steps) == ["load", "crunch", "finish"]
    assert steps["load"].get("restored") is True  # from its checkpoint
    assert "restored" not in steps["crunch"] and "restored" not in steps["finish"]
    assert executions == {"load": 1, "crunch": 2, "finish": 1}
    assert "deliveries: 2" in shown
    assert any(line.split(":", 1)[1].split()[:3] == ["load", "completed", "restored"]
               for line in shown.splitlines() if line.strip().startswith("step:"))
