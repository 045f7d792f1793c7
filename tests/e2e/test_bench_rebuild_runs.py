"""benchmarks/bench_rebuild.py still runs end to end (small sizes); timings unasserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 600.0  # only stops a hung benchmark


def test_bench_rebuild_quick_prints_every_section() -> None:
    done = subprocess.run([sys.executable, "bench_rebuild.py", "--quick"],
                          cwd=ROOT / "benchmarks", capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "== 1. Rebuild time" in out and "== 2. Requests during rebuilds" in out
    for size in ("200 flows", "1000 flows"):
        assert size in out
    assert "p99 during rebuilds / quiet:" in out
