"""`chainweaver runs list --caller X` lists X's runs and nobody else's, whatever X is:
ids with ``:``, ``|``, ``/``, ``*``, unicode, a percent-escape, or empty, against a
Redis history written through the store servers use (``team`` listing flow ``alpha``
once printed the runs of caller ``team:alpha``). The command runs in this process
(tests/cli/test_cli_runs_history.py runs the installed one)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from support.cli import completed

from chainweaver.mcp.runs.records import RunRecord

pytestmark = [pytest.mark.slow, pytest.mark.tasks]

CALLERS = ["team", "team:alpha", "team|alpha", "a/b", "*", "ünï-名", "", "%74eam"]
FLOWS = ["alpha", "beta"]


async def write_history(url: str, prefix: str) -> dict[tuple[str, str], str]:
    from chainweaver.mcp.runs.redis_records import RedisRunStore

    store = RedisRunStore(url, prefix=prefix)
    runs, now = {}, time.time()
    try:
        for seq, (caller, flow) in enumerate((c, f) for c in CALLERS for f in FLOWS):
            run_id = f"{seq:024x}"
            await store.save(RunRecord(run_id, flow, "1.0.0", flow, caller,
                                       int(now * 1e6) + seq, now, status="completed"),
                             new=True)
            runs[caller, flow] = run_id
    finally:
        await store.close()
    return runs


def listed(url: str, prefix: str, *options: str) -> list[str]:
    done = completed("runs", "list", "--store", url, "--prefix", prefix, "--json", *options)
    assert done.returncode == 0, done.stderr
    return [record["run_id"] for record in json.loads(done.stdout)["runs"]]


def test_list_by_caller_shows_that_callers_runs_only(redis_url: str) -> None:
    prefix = f"cli-callers:{time.time_ns()}"
    runs = asyncio.run(write_history(redis_url, prefix))

    def own(caller: str, *flows: str) -> list[str]:
        return sorted((run_id for (owner, flow), run_id in runs.items()
                       if owner == caller and flow in (flows or FLOWS)), reverse=True)

    # Every id, alone and with each flow (among them the pairs that once met in one
    # key, and the ids least like a key).
    for caller in CALLERS:
        assert listed(redis_url, prefix, "--caller", caller) == own(caller), caller
        for flow in FLOWS:
            assert listed(redis_url, prefix, "--caller", caller, "--flow", flow) == \
                own(caller, flow), (caller, flow)
