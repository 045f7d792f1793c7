"""benchmarks/bench_step_grants.py still runs end to end (--quick); timings unasserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 600.0  # only stops a hung benchmark


def test_bench_step_grants_quick_prints_every_section() -> None:
    done = subprocess.run([sys.executable, "bench_step_grants.py", "--quick"],
                          cwd=ROOT / "benchmarks", capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    assert "1. one check, 100 scopes + 100 claims held: p50" in done.stdout
    assert "2. 3-step run" in done.stdout and "per step" in done.stdout
    assert "3. the guarded run with an approval" in done.stdout and "per run" in done.stdout
