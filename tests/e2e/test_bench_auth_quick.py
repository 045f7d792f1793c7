"""``benchmarks/bench_auth.py --quick`` runs end to end: both servers behind JWT auth,
no failed call, every section printed. Timings are printed, never asserted here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_auth.py"


def test_quick_auth_run_succeeds_and_reports_every_figure() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    for section in ("== bench_auth ==", "== tools/call throughput and latency ==",
                    "== ratio ==", "== result =="):
        assert section in out
    for target in ("bare", "views"):
        # calls, errors, req/s, p50, p95, range of req/s over rounds
        row = re.search(rf"^{target}\s+(\d+)\s+(\d+)(\s+[\d.]+){{3}}\s+\d+-\d+$", out, re.M)
        assert row, out
        assert (row.group(1), row.group(2)) == ("40", "0")
    assert re.search(r"^views / bare throughput: [\d.]+x", out, re.M)
    assert "errors: 0 (target 0)" in out
