"""``benchmarks/load_http.py --quick`` runs end to end: three servers, no failed request,
every section printed. Timings are printed by the benchmark, never asserted here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "load_http.py"


def test_quick_load_run_succeeds_and_reports_every_figure() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    for section in ("== load_http ==", "== throughput and latency ==", "== ratio ==",
                    "== memory (server RSS) ==", "== result =="):
        assert section in out
    for target in ("bare", "flow", "flow+gate"):
        # requests, errors, req/s, p50, p95, p99, range of req/s over rounds
        row = re.search(rf"^{re.escape(target)}\s+(\d+)\s+(\d+)(\s+[\d.]+){{4}}\s+\d+-\d+$", out,
                        re.M)
        assert row, out
        assert (row.group(1), row.group(2)) == ("42", "0")
        assert re.search(rf"^{re.escape(target)}\s+before\s+[\d.]+ MiB\s+after\s+[\d.]+ MiB"
                         r"\s+growth\s+[+-][\d.]+ MiB  \(after each round: [\d. ]+\)$", out,
                         re.M), out
    assert re.search(r"^flow / bare throughput: [\d.]+x", out, re.M)
    assert "errors: 0 (target 0)" in out
