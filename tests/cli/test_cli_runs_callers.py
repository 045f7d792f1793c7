"""`chainweaver runs list --caller X` lists X's runs and nobody else's, whatever X is:
ids with ``:``, ``|``, ``/``, ``*``, unicode, a percent-escape, or empty, against a
Redis history written through the store servers use (``team`` listing flow ``alpha``
once printed the runs of caller ``team:alpha``). A caller id that would move the
terminal's cursor, colour it or print a row of its own is printed as a string literal,
and ``--caller`` takes an id that is not UTF-8 (a lone surrogate) without a traceback.
The commands run in this process (tests/cli/test_cli_runs_history.py runs the installed
one)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from support.cli import completed
from support.procs import free_port

from chainweaver.cli import main
from chainweaver.mcp.runs.records import RunRecord

pytestmark = [pytest.mark.slow, pytest.mark.tasks]

CALLERS = ["team", "team:alpha", "team|alpha", "a/b", "*", "ünï-名", "", "%74eam"]
FLOWS = ["alpha", "beta"]


async def write_history(url: str, prefix: str, callers: list[str] = CALLERS
                        ) -> dict[tuple[str, str], str]:
    from chainweaver.mcp.runs.redis_records import RedisRunStore

    store = RedisRunStore(url, prefix=prefix)
    runs, now = {}, time.time()
    try:
        for seq, (caller, flow) in enumerate((c, f) for c in callers for f in FLOWS):
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


# A caller id is whatever a token's subject says: an escape sequence, a line of its
# own, a tab, a lone surrogate (what `--caller $'\xff'` gives, too).
TERMINAL_CALLERS = ["evil\x1b[2J\x1b[31m", "x\n0123456789abcdef01234567  fake row", "a\tb",
                    "\udcff", "o'brien"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_and_show_print_hostile_caller_ids_as_literals(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"cli-terminal:{time.time_ns()}"
    runs = asyncio.run(write_history(redis_url, prefix, TERMINAL_CALLERS))
    store = ["--store", redis_url, "--prefix", prefix]
    code, out, err = run_cli(capsys, "runs", "list", *store)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 + len(runs)  # the header, and one line a run
    assert all(line.isprintable() for line in lines)
    for caller in TERMINAL_CALLERS:
        assert any(repr(caller) in line for line in lines), caller
    for caller in TERMINAL_CALLERS:
        code, out, err = run_cli(capsys, "runs", "list", "--caller", caller, "--flow",
                                 "beta", *store)
        assert code == 0 and err == "", err
        (row,) = out.splitlines()[1:]
        assert row.startswith(runs[caller, "beta"]) and repr(caller) in row
        code, out, err = run_cli(capsys, "runs", "show", runs[caller, "alpha"], *store)
        assert code == 0 and all(line.isprintable() for line in out.splitlines())
        assert f"caller: {caller!r}" in out
        code, out, _ = run_cli(capsys, "runs", "list", "--caller", caller, "--json", *store)
        assert [r["caller"] for r in json.loads(out)["runs"]] == [caller, caller]


def test_a_password_in_the_query_is_masked_when_the_store_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?password=hunter2&db=0"
    code, out, err = run_cli(capsys, "runs", "list", "--store", url)
    assert code == 3 and out == ""
    assert "hunter2" not in err and "?password=***&db=0: ConnectionError" in err, err
