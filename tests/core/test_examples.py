"""examples/engine_quickstart.py runs and prints its result and step log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_engine_quickstart_runs() -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "engine_quickstart.py")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "order_summary 1.0.0: success=True" in out
    assert ("output: {'status': 'shipped', 'total': '64.77 USD', "
            "'summary': 'Hi Ada, order A-1001 is shipped; total 64.77 USD.'}") in out
    for index, name in enumerate(["fetch_order", "price_order", "summarize"]):
        assert f"step {index} {name}" in out
    assert "in={'name': 'Ada', 'order_id': 'A-1001'" in out  # the input mapping at work
    assert "effective safety: read, idempotent=True" in out
    assert "order_summary 1.0.0: success=False" in out
    assert "error: LookupError at step 0 (fetch_order)" in out
    assert "out=FAILED (LookupError)" in out
    assert completed.stderr == ""


@pytest.mark.slow
def test_benchmark_script_runs() -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_executor.py"),
         "--repeats", "1", "--number", "20", "--no-upstream"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr
    for label in ("hand-written pydantic", "execute_flow ", "execute_flow_async",
                  "ratio execute_flow / hand-written", "ratio execute_flow_async"):
        assert label in completed.stdout
