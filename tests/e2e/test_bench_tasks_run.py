"""bench_tasks.py still runs end to end (``--quick``) and prints every section and
figure; timings are not asserted (machines are noisy)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.procs import stop

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 600.0  # only stops a hung benchmark
SECTIONS = [
    "== 1. tools/call as a task: time to the handle, vs a plain tools/call ==",
    "== 2. 100 short tasks in memory (50 at a time), vs 100 plain calls, 1 round(s) in "
    "turns ==",
    "== 3. 100 short tasks on Redis, queued first, then run by 1 or 2 workers, 1 round(s) "
    "in turns ==",
    "== 4. 100 short tasks on Redis, 1 worker: with checkpoints vs without ==",
    "== 5. Start with tasks: build + connect, 2000 flows vs 100 flows ==",
    "== Summary ==",
]
FIGURES = [
    r"  task handle / plain call: \d+\.\d+x",
    r"  in-memory tasks vs plain calls \(throughput\): \d+\.\d+",
    r"  Redis, 2 workers / 1 worker \(throughput\): \d+\.\d+x",
    r"  Redis, checkpoints / none \(per task\): \d+\.\d+x",
    r"  start with tasks, large catalogue / 100 flows: \d+\.\d+x",
    r"  start, large catalogue, with tasks / without: \d+\.\d+x",
    r"  1 worker\(s\): +\d+\.\d tasks/s \(.*worker CPU \d+\.\d+ ms per task\)",
    r"  2 worker\(s\): median +\d+\.\d tasks/s",
    r"  task throughput / plain call throughput \(medians\): \d+\.\d+",
]


def test_bench_tasks_quick_prints_every_section_and_figure() -> None:
    process = subprocess.Popen([sys.executable, "benchmarks/bench_tasks.py", "--quick"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        out, err = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        stop(process)
    assert process.returncode == 0, err
    lines = out.splitlines()
    for header in SECTIONS:
        assert header in lines, (header, out)
    for figure in FIGURES:
        assert any(re.match(figure, line) for line in lines), (figure, out)
