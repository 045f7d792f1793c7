"""`chainweaver serve`'s run-history flags, through the installed entry point on
127.0.0.1 over streamable HTTP with a real client: `--run-history memory://` serves
the runs as resources; `--run-history redis://...` with `--run-history-max-runs`,
`--run-history-max-age` and `--output-limit` keeps the newest runs with the age as
their keys' expiry, and sends larger outputs as links whose bytes have the audited
digest; without `--run-history` results still carry a run id and no run resource
answers; a bound without `--run-history`, or a bad one, never starts a server."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp import MCPError
from support.procs import STARTUP_TIMEOUT, free_port, stop, wait_until_listening

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHAINWEAVER = shutil.which("chainweaver", path=str(BIN)) or str(BIN / "chainweaver")
SERVE = ["serve", "examples/flows", "--tools", "examples/flow_tools.py"]
RUNS = "chainweaver://runs"
STATUS_OF = {"order_id": "A-1001"}  # order_status: about 110 bytes of output
SEARCH = {"query": "parcel"}  # help_search: about 60 bytes


async def quiet(message: object) -> None:
    """Drops the run's log messages (FastMCP's default handler prints them)."""


@asynccontextmanager
async def serving(tmp_path: Path, *flags: str) -> AsyncIterator[Client]:
    port = free_port()
    with open(tmp_path / f"server-{port}.log", "w") as log:
        process = subprocess.Popen(
            [CHAINWEAVER, *SERVE, "--transport", "streamable-http", "--host", "127.0.0.1",
             "--port", str(port), *flags], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            transport = StreamableHttpTransport(f"http://127.0.0.1:{port}/mcp")
            async with Client(transport, log_handler=quiet) as client:
                yield client
        finally:
            stop(process)


async def listing(client: Client, query: str = "") -> list[dict[str, Any]]:
    return json.loads((await client.read_resource(f"{RUNS}{query}"))[0].text)["runs"]


async def run_id_of(client: Client, flow: str, arguments: dict[str, Any]) -> str:
    result = await client.call_tool(flow, arguments, raise_on_error=False)
    return str(result.meta["chainweaver"]["run_id"])


@pytest.mark.anyio
async def test_memory_history_serves_runs_as_resources(tmp_path: Path) -> None:
    async with serving(tmp_path, "--run-history", "memory://") as client:
        first = await run_id_of(client, "order_status", STATUS_OF)
        second = await run_id_of(client, "help_search", SEARCH)
        failed = await run_id_of(client, "order_status", {"order_id": "A-9999"})
        record = json.loads((await client.read_resource(f"{RUNS}/{first}"))[0].text)
        runs = await listing(client)
        by_status = await listing(client, "?status=failed")
        templates = {t.uri_template for t in await client.list_resource_templates()}
        big = await client.call_tool("order_status", STATUS_OF)  # under 64 KiB: whole
    assert [r["run_id"] for r in runs] == [failed, second, first]
    assert [r["run_id"] for r in by_status] == [failed]
    assert record["status"] == "completed" and record["flow"] == "order_status"
    assert [s["id"] for s in record["steps"]] == ["find_order", "track_parcel",
                                                  "summarise_order"]
    assert "A-1001" not in json.dumps(record)
    assert {f"{RUNS}{{?flow,status,cursor,limit}}", f"{RUNS}/{{run_id}}"} <= templates
    assert not big.is_error and big.structured_content["order_id"] == "A-1001"


@pytest.mark.anyio
async def test_without_a_history_results_carry_run_ids_and_no_run_resource_answers(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as client:
        run_id = await run_id_of(client, "order_status", STATUS_OF)
        templates = {t.uri_template for t in await client.list_resource_templates()}
        with pytest.raises(MCPError) as missing:
            await client.read_resource(f"{RUNS}/{run_id}")
    assert len(run_id) == 24
    assert not any(template.startswith(RUNS) for template in templates)
    assert "not found" in missing.value.error.message.lower()


@pytest.mark.anyio
async def test_redis_history_keeps_the_bounds_and_links_large_outputs(
        tmp_path: Path, redis_url: str) -> None:
    from redis.asyncio import Redis

    store = redis_url.rsplit("/", 1)[0] + "/14"
    redis = Redis.from_url(store)
    await redis.flushdb()
    try:
        async with serving(tmp_path, "--run-history", store, "--run-history-max-runs", "3",
                           "--run-history-max-age", "120", "--output-limit", "100") as client:
            small = [await run_id_of(client, "help_search", SEARCH) for _ in range(3)]
            linked = await client.call_tool("order_status", STATUS_OF, raise_on_error=False)
            last = await run_id_of(client, "help_search", SEARCH)
            runs = await listing(client)
            meta = linked.meta["chainweaver"]
            whole = await client.read_resource(meta["output"]["uri"])
            ranged = await client.read_resource(meta["output"]["uri"] + "?offset=0&length=50")
            with pytest.raises(MCPError):
                await client.read_resource(f"{RUNS}/{small[0]}")  # past --run-history-max-runs
            ttl = await redis.ttl(f"chainweaver:runs:run:{last}")
    finally:
        await redis.aclose()
    kept = [last, meta["run_id"], small[2]]
    assert [r["run_id"] for r in runs] == kept
    # order_status has an output schema: above the limit, an isError result with a link.
    assert linked.is_error
    (link,) = [block for block in linked.content if block.type == "resource_link"]
    assert str(link.uri) == f"{RUNS}/{meta['run_id']}/output" == meta["output"]["uri"]
    data = whole[0].text.encode("utf-8")
    assert len(data) == link.size == meta["output"]["size"] > 100
    assert hashlib.sha256(data).hexdigest() == meta["output"]["sha256"]
    assert json.loads(data)["order_id"] == "A-1001"
    assert base64.b64decode(ranged[0].blob) == data[:50]
    record = next(r for r in runs if r["run_id"] == meta["run_id"])
    assert record["status"] == "completed"
    assert record["output_sha256"] == meta["output"]["sha256"]
    assert 0 < ttl <= 120  # --run-history-max-age is the records' expiry in Redis
    operator = subprocess.run([CHAINWEAVER, "runs", "list", "--store", store, "--json"],
                              cwd=ROOT, capture_output=True, text=True,
                              timeout=STARTUP_TIMEOUT)
    assert operator.returncode == 0, operator.stderr
    shown = json.loads(operator.stdout)["runs"]
    assert [r["run_id"] for r in shown] == kept
    assert next(r for r in shown if r["run_id"] == meta["run_id"])["output_stored"] is True


@pytest.mark.parametrize(("flags", "code", "message"), [
    (["--output-limit", "100"], 2, "chainweaver: error: --output-limit needs --run-history URL"),
    (["--run-history-max-runs", "3", "--run-history-max-age", "60"], 2,
     "chainweaver: error: --run-history-max-runs, --run-history-max-age need --run-history "
     "URL"),
    (["--run-history", "memory://", "--run-history-max-runs", "0"], 1,
     "chainweaver: error: max_runs must be"),
    (["--run-history", "file:///tmp/runs"], 1,
     "chainweaver: error: run_history store must be a URL starting with memory://, "
     "redis://, rediss://"),
])
def test_bad_run_history_flags_never_start_a_server(flags: list[str], code: int,
                                                     message: str) -> None:
    done = subprocess.run([CHAINWEAVER, *SERVE, *flags], cwd=ROOT, input="",
                          capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
    assert (done.returncode, done.stdout) == (code, "")
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1
