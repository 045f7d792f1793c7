"""The operators' commands read what Redis holds, and Redis may hold anything: entries
damaged, edited by hand, or written by another release or a hostile process. ``chainweaver
flows status`` and ``chainweaver runs list|show`` then still print what they can read,
exit as documented, never end in a traceback, and print nothing a terminal would act on
(an escape sequence, a newline) except as a string literal. The commands run as the
operator runs them, as processes, against a real Redis (the second adversarial pass of
issue 32)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from support.procs import STARTUP_TIMEOUT

pytestmark = [pytest.mark.slow, pytest.mark.tasks]

BIN = Path(sys.executable).parent
CHAINWEAVER = shutil.which("chainweaver", path=str(BIN)) or str(BIN / "chainweaver")
ESCAPE = "\x1b[2J\x1b[31m"  # clears the screen, then prints in red


def chainweaver(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHAINWEAVER, *argv], capture_output=True, text=True,
                          timeout=STARTUP_TIMEOUT, errors="surrogateescape")


def no_traceback_nor_escape(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert "\x1b" not in done.stdout + done.stderr


def test_flows_status_shows_hostile_heartbeats_and_audit_entries_as_data(
        redis_url: str) -> None:
    prefix = f"hostile-status:{time.time_ns()}"
    raw = redis.Redis.from_url(redis_url)
    now = time.time()
    heartbeats = {
        "wrong-types": {"seen": now, "version": "seven", "unreadable": ["flow1"],
                        "not_applied": "all of them", "pending": [1],
                        "last_outage": {"from": "then", "to": 1e300}},
        "far-future": {"seen": now, "applied_at": 1e308, "interval": "often",
                       "last_outage": {"from": 0, "to": float("inf")}},
        "not-a-number": {"seen": now, "applied_at": float("nan")},
        f"evil{ESCAPE}": {"seen": now, "role": ESCAPE, "state": "serving\nFAKE ROW",
                          "unreadable": {f"flow{ESCAPE}": f"why{ESCAPE}"}},
    }
    raw.hset(f"{prefix}:heartbeats", mapping={name: json.dumps(record)
                                              for name, record in heartbeats.items()})
    raw.hset(f"{prefix}:decisions", mapping={f"name{ESCAPE}": '{"all": "archived"}',
                                             "report": '{"all": "paused\\u001b[2J"}'})
    raw.xadd(f"{prefix}:audit", {"version": "1", "name": f"x{ESCAPE}", "at": "nan",
                                 "by": f"ops{ESCAPE}", "reason": f"because{ESCAPE}"})
    raw.xadd(f"{prefix}:audit", {"version": "2", "name": "y", "at": "1e400"})
    raw.close()
    done = chainweaver("flows", "status", "--governance", redis_url, "--prefix", prefix)
    assert done.returncode == 0, done.stderr
    no_traceback_nor_escape(done)
    out = done.stdout
    assert "wrong-types" in out and "far-future" in out and "not-a-number" in out
    assert repr(f"evil{ESCAPE}") in out and repr(f"name{ESCAPE}") in out
    assert "FAKE ROW" not in out.replace("\\nFAKE ROW", "")  # no row of its own
    assert repr(f"ops{ESCAPE}") in out and repr(f"because{ESCAPE}") in out
    # The same through --json, for scripts: the values themselves.
    as_json = chainweaver("flows", "status", "--json", "--governance", redis_url,
                          "--prefix", prefix)
    assert as_json.returncode == 0, as_json.stderr
    assert f"evil{ESCAPE}" in json.loads(as_json.stdout)["processes"]


def test_flows_wait_names_hostile_processes_as_literals(redis_url: str) -> None:
    prefix = f"hostile-wait:{time.time_ns()}"
    raw = redis.Redis.from_url(redis_url)
    raw.hset(f"{prefix}:heartbeats", f"evil{ESCAPE}", json.dumps(
        {"seen": time.time() + 3600, "version": 0,
         "unreadable": {"report": f"unreadable{ESCAPE}"}}))
    raw.close()
    done = chainweaver("flows", "archive", "report", "--wait", "0.2", "--governance",
                       redis_url, "--prefix", prefix)
    assert done.returncode == 1, done.stderr
    no_traceback_nor_escape(done)
    assert repr(f"evil{ESCAPE}") in done.stderr


def test_runs_list_and_show_skip_what_they_cannot_read(redis_url: str) -> None:
    prefix = f"hostile-runs:{time.time_ns()}"
    raw = redis.Redis.from_url(redis_url)
    now = time.time()
    seq = int(now * 1e6)
    base = {"flow": "report", "version": "1.0.0", "tool": "report", "caller": "ops",
            "seq": seq, "started_at": now, "status": "completed"}
    records = {
        "a" * 24: {**base, "run_id": "a" * 24},  # readable
        # readable, with steps and approvals lacking every key, and far-off times
        "b" * 24: {**base, "run_id": "b" * 24, "ended_at": 1e300, "steps": [{}],
                   "approvals": [{"at": float("inf")}]},
        "c" * 24: {**base, "run_id": "c" * 24, "started_at": "soon"},  # unreadable
        "d" * 24: {**base, "run_id": "f" * 24},  # another run's record
    }
    for run_id, record in records.items():
        raw.set(f"{prefix}:run:{run_id}", json.dumps(record))
        raw.zadd(f"{prefix}:all", {run_id: seq})
    raw.set(f"{prefix}:run:{'e' * 24}", b"\xff not json")
    raw.zadd(f"{prefix}:all", {"e" * 24: seq, b"\xff\xfe": seq, "f" * 24: float("inf")})
    raw.close()
    listed = chainweaver("runs", "list", "--store", redis_url, "--prefix", prefix)
    assert listed.returncode == 0, listed.stderr
    no_traceback_nor_escape(listed)
    rows = listed.stdout.splitlines()[1:]
    assert sorted(row.split()[0] for row in rows) == ["a" * 24, "b" * 24]
    shown = chainweaver("runs", "show", "b" * 24, "--store", redis_url, "--prefix", prefix)
    assert shown.returncode == 0, shown.stderr
    no_traceback_nor_escape(shown)
    assert "step: ? ? attempts=? ? ms" in shown.stdout
    for unreadable in ("c" * 24, "d" * 24, "e" * 24):
        missing = chainweaver("runs", "show", unreadable, "--store", redis_url, "--prefix",
                              prefix)
        assert missing.returncode == 1, (unreadable, missing.stderr)
        no_traceback_nor_escape(missing)
        assert "no run" in missing.stderr
