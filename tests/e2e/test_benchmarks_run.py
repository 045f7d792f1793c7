"""The benchmarks still run end to end: each script, in a small configuration, exits 0
and prints every section. Timings are not asserted (machines are noisy); the scripts'
own consistency checks (candidate and baseline return the same results) are."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.procs import stop

ROOT = Path(__file__).resolve().parents[2]
# Only stops a hung benchmark; never a speed requirement.
RUN_TIMEOUT = 600.0

SERVER_SECTIONS = [
    "== 1. Construct FlowServer over 100 registered flows",
    "== 2. Lists right after construction, 100 flows",
    "== 3. tools/call round trip",
    "== 4. Schema resources, 100 flows",
    "== 5. Prompts, 100 flows",
    "== Summary ==",
]
# Rows that carry a target, each reported once in the summary with PASS or MISS.
SERVER_TARGETS = [
    "tools only",
    "expose_schemas",
    "expose_schemas + expose_prompts",
    "FlowServer, 1 flow vs bare, 1 tool",
    "FlowServer, 100 flows vs bare, 1 tool",
    "notifications on vs bare async, same ones",
    "the same, tools blocking=False",
    "resources/list",
    "resources/read",
    "prompts/list",
    "prompts/get",
]
FIGURE = r"\d+\.\d+ (ms|us)"
STARTUP_SERVERS = ["bare FastMCP, 1 tool", "FlowServer, 10 flows", "FlowServer, 400 flows"]
STARTUP_PARTS = [
    "walk the registry (names, get_flow)",
    "executor.check_flow",
    "executor.effective_safety",
    "policy filters (_exclusion_reason)",
    "build_contract (shared per model pair)",
    "snapshot entries and the rest",
    "every flow decided (catalogue), total",
    "FlowServer(...), total",
]
GC_VARIANTS = ["no freeze", "freeze_gc=True", "freeze after first lists"]
LIST_KINDS = ["tools/list", "prompts/list", "resources/list"]
EXECUTOR_LINES = [
    "3-step flow, 2 repeats; microseconds per call (best / median)",
    "hand-written pydantic",
    "execute_flow ",
    "execute_flow_async",
    "ratio execute_flow / hand-written",
    "ratio execute_flow_async / hand-written",
    "of which an empty worker-thread hop costs",
    "Fan-out: 4 async branches awaiting 100 ms each",
    "ratio execute_flow_async / longest branch",
    "100-step DAG, 2 repeats; microseconds per step (best)",
    "plan compilations       1",
    "ratio per step / hand-written",
]


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    process = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        stop(process)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_bench_server_quick_prints_every_section() -> None:
    result = run_script("benchmarks/bench_server.py", "--quick")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for header in SERVER_SECTIONS:
        assert any(line.startswith(header) for line in lines), (header, result.stdout)

    summary = result.stdout.split("== Summary ==", 1)[1].splitlines()
    verdicts = [line.strip() for line in summary if re.match(r"\s+(PASS|MISS)  ", line)]
    labels = [re.split(r"\s{2,}", line)[1] for line in verdicts]
    assert labels == SERVER_TARGETS, result.stdout
    for line in verdicts:
        # Each verdict carries its measured value: a ratio, or a time in ms/us.
        assert re.search(r"\d+\.\d+(x| ms| us)", line), line


def test_bench_executor_small_run_prints_every_line() -> None:
    # --no-upstream: the comparison with the reference package installs it from PyPI.
    result = run_script("benchmarks/bench_executor.py", "--repeats", "2", "--number", "200",
                        "--no-upstream")
    assert result.returncode == 0, result.stderr
    for expected in EXECUTOR_LINES:
        assert expected in result.stdout, (expected, result.stdout)
    for target in ("1.5x", "2x"):
        assert re.search(rf"target <= {re.escape(target)}: (ok|OVER)", result.stdout)


def test_bench_startup_quick_prints_every_figure() -> None:
    result = run_script("benchmarks/bench_startup.py", "--quick")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    lines = out.splitlines()

    def line_with(*parts: str) -> str:
        found = [line for line in lines if all(part in line for part in parts)]
        assert found, (parts, out)
        return found[0]

    assert "== 1. Start = construct + in-memory client connected" in out, out
    for server in STARTUP_SERVERS:
        assert re.search(FIGURE, line_with("first start in process", server)), out
        row = line_with(f"  {server}", "start ", "construct", "connect")
        assert len(re.findall(FIGURE, row)) == 6, row  # best / median of each
    for label, target in [("large vs small", "3x"), ("large vs bare", "10x")]:
        verdict = line_with(f"start, {label}")
        assert re.match(rf"\s+(PASS|FAIL)  start, {label}\s+\d+\.\dx \(median "
                        rf"\d+\.\dx\)  target <= {target}$", verdict), verdict

    assert "== 2. Construction over 400 flows by part" in out, out
    for part in STARTUP_PARTS:
        assert re.search(FIGURE + r"\s+-?\d+\.\d+ us/flow", line_with(part)), out

    for size in ("100", "400"):
        block = out.split(f"== 3. Lists at {size} flows", 1)[1].split("\n==", 1)[0]
        for variant in GC_VARIANTS:
            assert f"  {variant} (" in block, (variant, block)
        rows = [line for line in block.splitlines()
                if line.strip().split(" ", 1)[0] in LIST_KINDS]
        assert len(rows) == len(GC_VARIANTS) * len(LIST_KINDS), block
        for row in rows:
            assert len(re.findall(FIGURE, row)) >= 4, row  # best, median, in gc, first
        assert sum("no freeze / this:" in row for row in rows) == 6, block


def test_bench_runs_prints_both_sides_and_the_ratio() -> None:
    completed = run_script("benchmarks/bench_runs.py", "--repeats", "1", "--number", "20")
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    for line in ("off (no progress token, no log level)",
                 "on  (3 progress + 6 log notifications)"):
        assert re.search(re.escape(line) + r": best " + FIGURE, out), out
    assert re.search(r"ratio on/off: best \d+\.\d+x, median of paired chunks \d+\.\d+x", out)


def test_bench_hidden_runs_and_checks_the_refusals_match() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_hidden.py"),
                           "--chunks", "1", "--number", "2"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    for kind in ("tools/call", "resources/read", "prompts/get"):
        assert re.search(rf"{re.escape(kind)} +visible .* hidden / never existed "
                         r"\d+\.\d+x", done.stdout), done.stdout


PAGE_KINDS = ["tools/list", "resources/list", "prompts/list"]
PAGE_ROWS = [
    "cold first page, new executor",
    "cold first page, warm executor",
    "cold first page, catalogue decided",
    "FlowServer, first page",
    "FlowServer, middle page",
    "bare FastMCP, first page",
    "bare FastMCP, middle page",
]


def test_bench_pages_quick_prints_every_section() -> None:
    result = run_script("benchmarks/bench_pages.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for kind in PAGE_KINDS:
        block = out.split(f"== {kind}", 1)[1].split("\n==", 1)[0]
        for row in PAGE_ROWS:
            found = [line for line in block.splitlines() if line.strip().startswith(row)]
            assert len(found) == 1, (kind, row, block)
            # best / median at both sizes, then the ratio between the sizes.
            assert len(re.findall(FIGURE, found[0])) == 4, found[0]
            assert re.search(r"2,000/200 \d+\.\d+x \(median \d+\.\d+x\)", found[0]), found[0]
    summary = out.split("== Summary: steady-state page, 2,000 / 200 flows ==", 1)[1]
    verdicts = re.findall(r"^\s+(?:PASS|MISS)  (\S+ \w+ page)\s+\d+\.\d+x \(median "
                          r"\d+\.\d+x\)  target <= 1\.5x$", summary, re.MULTILINE)
    assert verdicts == [f"{kind} {page} page" for kind in PAGE_KINDS
                        for page in ("first", "middle")], summary


def test_bench_before_after_quick_runs_both_sides() -> None:
    # HEAD as the "before" ref: what is compared does not matter here, only that both
    # sides run, import their own package (the script checks it) and are tabulated.
    result = run_script("benchmarks/bench_before_after.py", "--ref", "HEAD", "--rounds", "1",
                        "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"^before: chainweaver at HEAD \([0-9a-f]{12}\); after: the working "
                     r"tree's chainweaver", out, re.MULTILINE), out
    for side in ("before", "after"):
        assert re.search(rf"^round 1 {side} ", out, re.MULTILINE), out
    medians = out.split("== Medians over the runs ==", 1)[1]
    for op in ("FlowServer, 1 flow vs bare, 1 tool", "FlowServer, 100 flows vs bare, 1 tool",
               "resources/list", "resources/read", "prompts/list", "prompts/get"):
        assert re.search(rf"^  {re.escape(op)}\s+\d+\.\d+x \(\d+\.\d+x\)\s+\d+\.\d+x "
                         r"\(\d+\.\d+x\)\s+\d+\.\d+x$", medians, re.MULTILINE), (op, medians)


def test_request_instructions_runs_each_kind_of_request() -> None:
    # What valgrind counts (see the script): here only that it runs and makes them.
    for kind in ("read", "get", "call", "bare-call", "run", "hand"):
        result = run_script("benchmarks/request_instructions.py", kind, "--number", "3",
                            "--flows", "5")
        assert result.returncode == 0, result.stderr[-2000:]
    for options in (["--non-blocking"], *(["--feature", feature] for feature in
                                          ("history", "metrics", "tracing"))):
        result = run_script("benchmarks/request_instructions.py", "call", "--number", "3",
                            "--flows", "5", *options)
        assert result.returncode == 0, result.stderr[-2000:]
