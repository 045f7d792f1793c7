"""`chainweaver runs list|show` against the Redis history a real `chainweaver serve
--run-history redis://...` wrote while two callers (bearer tokens) called its flows
over streamable HTTP on 127.0.0.1: the runs newest first, filtered by flow, status and
caller, paged with --cursor, as text and as JSON (never an argument value), and every
bad input with its exit code (0 success, 1 no such run, 2 a malformed command line, 3 a
store that cannot be read).

The first test runs the installed entry point; the others run the same ``main`` in
this process (a Python start each would cost about 2 s)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from support.cli import completed
from support.procs import STARTUP_TIMEOUT, free_port, stop, wait_until_listening

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHAINWEAVER = shutil.which("chainweaver", path=str(BIN)) or str(BIN / "chainweaver")
SERVE = ["serve", "examples/flows", "--tools", "examples/flow_tools.py",
         "--transport", "streamable-http", "--host", "127.0.0.1"]
TOKENS = {"token-1": "alice-token-0123456789", "token-2": "bob-token-0123456789"}
SECRET_ORDER = "A-1003"  # an argument value: never in what `runs` prints


@dataclass(frozen=True)
class Run:
    run_id: str
    caller: str  # the token file's line
    flow: str
    status: str


@dataclass(frozen=True)
class History:
    store: str
    runs: list[Run]  # oldest first
    records: dict[str, dict[str, Any]]  # run id -> the record its caller read over MCP


def installed(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed ``chainweaver`` command, in a process of its own."""
    return subprocess.run([CHAINWEAVER, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=STARTUP_TIMEOUT)


chainweaver = completed  # in this process: the same main as the installed command


async def quiet(message: object) -> None:
    """Drops the run's log messages (FastMCP's default handler prints them)."""


async def call_flows(url: str) -> tuple[list[Run], dict[str, dict[str, Any]]]:
    calls = [("token-1", "order_status", {"order_id": "A-1001"}),
             ("token-2", "help_search", {"query": "parcel"}),
             ("token-1", "order_status", {"order_id": "A-9999"}),  # fails: no such order
             ("token-1", "order_total", {"order_id": SECRET_ORDER, "to_currency": "USD"}),
             ("token-2", "order_status", {"order_id": SECRET_ORDER})]
    runs, records = [], {}
    for who, flow, arguments in calls:
        transport = StreamableHttpTransport(url, headers={
            "Authorization": f"Bearer {TOKENS[who]}"})
        async with Client(transport, log_handler=quiet) as client:
            result = await client.call_tool(flow, arguments, raise_on_error=False)
            run_id = result.meta["chainweaver"]["run_id"]
            read = await client.read_resource(f"chainweaver://runs/{run_id}")
            records[run_id] = json.loads(read[0].text)
        runs.append(Run(run_id, who, flow, "failed" if result.is_error else "completed"))
    return runs, records


@pytest.fixture(scope="module")
def history(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    """A server writing to a Redis database of its own, five runs by two callers."""
    store = redis_url.rsplit("/", 1)[0] + "/13"
    from redis import Redis

    with Redis.from_url(store) as redis:
        redis.flushdb()
    workdir = tmp_path_factory.mktemp("runs-cli")
    tokens = workdir / "tokens.txt"
    tokens.write_text("".join(f"{token}\n" for token in TOKENS.values()))
    tokens.chmod(0o600)
    port = free_port()
    with open(workdir / "server.log", "w") as log:
        process = subprocess.Popen(
            [CHAINWEAVER, *SERVE, "--port", str(port), "--auth-token-file", str(tokens),
             "--run-history", store], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            runs, records = asyncio.run(call_flows(f"http://127.0.0.1:{port}/mcp"))
        finally:
            stop(process)
    yield History(store, runs, records)


def listed(history: History, *options: str, command: Any = chainweaver) -> dict[str, Any]:
    done = command("runs", "list", "--store", history.store, "--json", *options)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


def ids(page: dict[str, Any]) -> list[str]:
    return [record["run_id"] for record in page["runs"]]


def newest_first(runs: list[Run]) -> list[str]:
    return [run.run_id for run in reversed(runs)]


def test_list_json_gives_every_run_newest_first_without_values(history: History) -> None:
    page = listed(history, command=installed)
    assert ids(page) == newest_first(history.runs) and page["next_cursor"] is None
    for record, run in zip(page["runs"], reversed(history.runs), strict=True):
        assert (record["flow"], record["status"]) == (run.flow, run.status)
        assert record["caller"].startswith(run.caller)  # the gate's id for the token
        # What the caller read over MCP, plus what only the operator sees.
        operator_only = {"caller", "seq", "output_stored"}
        assert {k: v for k, v in record.items() if k not in operator_only} == \
            history.records[run.run_id]
    failed = next(r for r in page["runs"] if r["status"] == "failed")
    assert (failed["error_type"], failed["error_step"]) == ("LookupError", "find_order")
    assert SECRET_ORDER not in json.dumps(page) and "A-9999" not in json.dumps(page)


def test_list_filters_by_flow_status_and_caller(history: History) -> None:
    by_flow = listed(history, "--flow", "order_status")
    assert ids(by_flow) == newest_first([r for r in history.runs if r.flow == "order_status"])
    failed = listed(history, "--status", "failed")
    assert ids(failed) == newest_first([r for r in history.runs if r.status == "failed"])
    callers = {record["caller"] for record in listed(history)["runs"]}
    alice = next(c for c in callers if c.startswith("token-1"))
    mine = listed(history, "--caller", alice)
    assert ids(mine) == newest_first([r for r in history.runs if r.caller == "token-1"])
    both = listed(history, "--caller", alice, "--flow", "order_status", "--status",
                  "completed")
    assert ids(both) == newest_first([r for r in history.runs if r.caller == "token-1"
                                      and r.flow == "order_status"
                                      and r.status == "completed"])
    assert listed(history, "--caller", "nobody") == {"runs": [], "next_cursor": None}


def test_list_pages_with_limit_and_cursor(history: History) -> None:
    seen, cursor, pages = [], None, 0
    while True:
        page = listed(history, "--limit", "2", *(["--cursor", cursor] if cursor else []))
        seen += ids(page)
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == newest_first(history.runs) and pages == 3
    text = chainweaver("runs", "list", "--store", history.store, "--limit", "2")
    assert text.returncode == 0
    more = listed(history, "--limit", "2")["next_cursor"]
    assert text.stderr == f"chainweaver: more runs: --cursor {more}\n"


def test_list_as_text_is_one_aligned_row_a_run(history: History) -> None:
    done = chainweaver("runs", "list", "--store", history.store)
    assert done.returncode == 0 and done.stderr == ""
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["RUN", "STARTED", "STATUS", "FLOW", "VERSION", "CALLER",
                              "ERROR"]
    assert [row.split()[0] for row in rows] == newest_first(history.runs)
    for row, run in zip(rows, reversed(history.runs), strict=True):
        cells = row.split()
        assert cells[3:5] == [run.status, run.flow]  # after the date and the time
        assert cells[-1] == ("LookupError" if run.status == "failed" else "-")
        assert row.index(f" {run.status} ") == header.index(" STATUS ")  # aligned
    assert SECRET_ORDER not in done.stdout


def test_show_prints_one_record_as_text_and_json(history: History) -> None:
    run = history.runs[0]
    as_json = chainweaver("runs", "show", run.run_id, "--store", history.store, "--json")
    assert as_json.returncode == 0 and as_json.stderr == ""
    record = json.loads(as_json.stdout)
    assert record["run_id"] == run.run_id and record["status"] == "completed"
    steps = ["find_order", "track_parcel", "summarise_order"]
    assert [step["id"] for step in record["steps"]] == steps
    as_text = chainweaver("runs", "show", run.run_id, "--store", history.store)
    assert as_text.returncode == 0 and as_text.stderr == ""
    lines = as_text.stdout.splitlines()
    assert f"        run_id: {run.run_id}" in lines
    assert "        status: completed" in lines and "          flow: order_status" in lines
    assert [line.split()[1] for line in lines if line.strip().startswith("step:")] == steps
    assert f"output_sha256: {record['output_sha256']}" in as_text.stdout


@pytest.mark.parametrize("run_id", ["0" * 24, "not-a-run-id"])
def test_show_of_an_unknown_run_exits_1_with_one_line(history: History, run_id: str) -> None:
    done = chainweaver("runs", "show", run_id, "--store", history.store)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"chainweaver: error: no run {run_id!r} in the history at "
                           "chainweaver:runs (unknown, or expired)\n")
    other_prefix = chainweaver("runs", "show", history.runs[0].run_id, "--store",
                               history.store, "--prefix", "elsewhere")
    assert other_prefix.returncode == 1 and "no run" in other_prefix.stderr


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["list", "--store", "memory://"], 2,
     "chainweaver: error: --store must be a redis:// URL: a memory:// history lives only "
     "inside its server\n"),
    (["list", "--store", "{store}", "--limit", "0"], 2,
     "chainweaver: error: --limit must be at least 1\n"),
    (["list", "--store", "{store}", "--cursor", "page-2"], 2,
     "chainweaver: error: --cursor 'page-2' is not one a page printed\n"),
    (["show", "0" * 24, "--store", "redis://127.0.0.1:notaport/0"], 2,
     "chainweaver: error: --store: "),
    (["show", "0" * 24, "--store", "redis://user:hunter2@127.0.0.1:{closed}/0"], 3,
     "chainweaver: error: cannot read the run history at "
     "redis://user:***@127.0.0.1:{closed}/0: ConnectionError\n"),
])
def test_bad_input_is_one_line_on_stderr_with_its_exit_code(
        history: History, argv: list[str], code: int, message: str) -> None:
    closed = str(free_port())
    argv = [arg.format(store=history.store, closed=closed) for arg in argv]
    done = chainweaver("runs", *argv)
    assert (done.returncode, done.stdout) == (code, "")
    assert done.stderr.startswith(message.format(closed=closed))
    assert done.stderr.count("\n") == 1 and "hunter2" not in done.stderr


@pytest.mark.parametrize("argv", [["list", "--store", "redis://x", "--status", "done"],
                                  ["show", "--store", "redis://x"], ["list"], []])
def test_a_malformed_command_line_exits_2(argv: list[str]) -> None:
    done = chainweaver("runs", *argv)
    assert done.returncode == 2 and done.stdout == ""
    assert "usage: chainweaver runs" in done.stderr
