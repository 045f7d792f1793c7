"""bench_server.py's request sections on the code at a git ref (before) and on the
working tree (after), run alternately, each ratio against bare FastMCP in its own run.

The ``chainweaver`` package at ``--ref`` is extracted with ``git archive REF
chainweaver | tar -x``; the working tree's ``chainweaver`` is copied once at the start
(so edits made to the tree during the run do not mix into it), or, with ``--after
REF``, extracted at that ref too. Both must import before any round. Each run is a child
process of the current ``benchmarks/bench_server.py --sections 3,4,5`` (``tools/call``,
``resources/list``/``read``, ``prompts/list``/``get``) with ``PYTHONPATH`` naming one of
the two copies; the child prints the ``chainweaver`` it imported and the script checks
it is that copy. Rounds alternate which side goes first (before, after; after, before;
...), so drift in the machine's load falls on both sides. See benchmarks/README.md.

Run: ``python benchmarks/bench_before_after.py [--ref da2507d] [--after REF] [--rounds 3]
[--quick] [bench_server.py options, e.g. --repeats 5 --list-number 10]``
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_SCRIPT = ROOT / "benchmarks" / "bench_server.py"
SECTIONS = "3,4,5"
# Runs the script as ``python SCRIPT ARGS`` would, after saying which chainweaver the
# interpreter imports (sys.path[0] is the script's folder, never the current one).
CHILD = """
import os, runpy, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(script)
import chainweaver
print("chainweaver imported from " + chainweaver.__file__, flush=True)
runpy.run_path(script, run_name="__main__")
"""
IMPORTED = re.compile(r"^chainweaver imported from (?P<path>.+)$", re.MULTILINE)
# A bench_server.py row with a baseline: "  LABEL  best / median   bare best / median
# RATIOx (median RATIOx)".
RATIO_ROW = re.compile(
    r"^  (?P<label>\S.*?|\s\s\S.*?)\s+\d+\.\d+ (?:ms|us) / .*\bbare\b.*?"
    r"(?P<best>\d+\.\d+)x \(median\s+(?P<median>\d+\.\d+)x\)", re.MULTILINE)


class Failed(Exception):
    """A run failed or imported the wrong package (the script exits 1)."""


@dataclass
class Side:
    """One of the two packages, and the ratios its runs measured per op."""

    name: str
    package: Path  # the folder holding chainweaver/
    ratios: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def extract(ref: str, into: Path) -> str:
    """``chainweaver`` at ``ref`` under ``into``; returns the commit ``ref`` names."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", ref + "^{commit}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", commit, "chainweaver"],
                               stdout=subprocess.PIPE)
    assert archive.stdout is not None
    untar = subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise Failed(f"could not extract chainweaver at {ref}")
    return commit


def copy_tree(into: Path) -> None:
    """The working tree's ``chainweaver`` under ``into``, as it is now."""
    shutil.copytree(ROOT / "chainweaver", into / "chainweaver",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def digest(package: Path) -> str:
    """A short hash of the package's Python sources (which code a side ran)."""
    hashed = hashlib.sha256()
    for path in sorted((package / "chainweaver").rglob("*.py")):
        hashed.update(path.relative_to(package).as_posix().encode() + b"\0")
        hashed.update(path.read_bytes())
    return hashed.hexdigest()[:12]


def side_env(side: Side) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(side.package), "PYTHONDONTWRITEBYTECODE": "1"}


def preflight(side: Side, workdir: Path) -> None:
    """``chainweaver.mcp`` imports from ``side``'s copy (a tree caught mid-edit does
    not), before any round is spent."""
    done = subprocess.run([sys.executable, "-c", "import chainweaver.mcp"], cwd=workdir,
                          env=side_env(side), capture_output=True, text=True)
    if done.returncode != 0:
        raise Failed(f"the {side.name} package does not import (a tree being edited?):\n"
                     f"{done.stderr[-2000:]}")


def run_side(side: Side, options: list[str], workdir: Path) -> str:
    """One bench_server.py run on ``side``'s package; returns its output."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(SERVER_SCRIPT), "--sections", SECTIONS, *options],
        cwd=workdir, env=side_env(side), capture_output=True, text=True)
    if done.returncode != 0:
        raise Failed(f"{side.name} run exited {done.returncode}:\n{done.stdout[-2000:]}"
                     f"\n{done.stderr[-4000:]}")
    imported = IMPORTED.search(done.stdout)
    if imported is None:
        raise Failed(f"{side.name} run did not say which chainweaver it imported")
    path = Path(imported["path"]).resolve()
    if not path.is_relative_to((side.package / "chainweaver").resolve()):
        raise Failed(f"{side.name} run imported {path}, not the package under "
                     f"{side.package}")
    return done.stdout


def record(side: Side, output: str) -> list[str]:
    """Note the ratios of one run; returns its labels in order."""
    labels = []
    for row in RATIO_ROW.finditer(output):
        label = row["label"].strip()
        side.ratios.setdefault(label, []).append((float(row["best"]), float(row["median"])))
        labels.append(label)
    if not labels:
        raise Failed(f"no ratio rows in the {side.name} run:\n{output[-2000:]}")
    return labels


def cell(values: list[tuple[float, float]]) -> str:
    return ", ".join(f"{best:.2f}x ({median:.2f}x)" for best, median in values)


def table(labels: list[str], before: Side, after: Side) -> None:
    """Per op: every run's ratio (best / best, median / median in brackets), then the
    median over the runs of each."""
    print("\n== Ratios vs bare FastMCP: best/best (median/median), per run ==")
    for label in labels:
        b, a = before.ratios.get(label, []), after.ratios.get(label, [])
        print(f"  {label}\n    before  {cell(b)}\n    after   {cell(a)}")
    print("\n== Medians over the runs ==")
    print(f"  {'op':<48} {'before':>16} {'after':>16} {'after/before':>13}")
    for label in labels:
        b, a = before.ratios.get(label, []), after.ratios.get(label, [])
        if not b or not a:
            print(f"  {label:<48} missing on one side")
            continue
        mb = statistics.median(best for best, _ in b)
        ma = statistics.median(best for best, _ in a)
        mb_med = statistics.median(median for _, median in b)
        ma_med = statistics.median(median for _, median in a)
        print(f"  {label:<48} {mb:6.2f}x ({mb_med:.2f}x) {ma:6.2f}x ({ma_med:.2f}x)"
              f" {ma / mb:12.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0].replace("\n", " "),
        epilog="Other options go to bench_server.py (e.g. --repeats 5 --list-number 10).")
    parser.add_argument("--ref", default="da2507d", help="the 'before' git ref (da2507d)")
    parser.add_argument("--after", metavar="REF",
                        help="the 'after' git ref (default: the working tree, copied)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs per side; the sides alternate (3)")
    parser.add_argument("--quick", action="store_true",
                        help="pass --quick to bench_server.py (100 flows, small batches)")
    args, server_options = parser.parse_known_args()
    if args.quick:
        server_options = ["--quick", *server_options]

    with tempfile.TemporaryDirectory(prefix="bench-before-after-") as tmp:
        base = Path(tmp)
        before = Side("before", base / "before")
        after = Side("after", base / "after")
        for side in (before, after):
            side.package.mkdir()
        try:
            commit = extract(args.ref, before.package)
            if args.after is None:
                copy_tree(after.package)
                source = (f"the working tree's chainweaver, copied "
                          f"{time.strftime('%Y-%m-%d %H:%M %Z')}")
            else:
                source = f"chainweaver at {args.after} ({extract(args.after, after.package)[:12]})"
            for side in (before, after):
                preflight(side, base)
            print(f"before: chainweaver at {args.ref} ({commit[:12]}); after: {source}")
            print(f"sources: before {digest(before.package)}, after {digest(after.package)} "
                  "(sha256 of the .py files)")
            print(f"bench_server.py --sections {SECTIONS} {' '.join(server_options)}; "
                  f"{args.rounds} round(s) per side\n", flush=True)
            labels: list[str] = []
            for turn in range(args.rounds):
                order = (before, after) if turn % 2 == 0 else (after, before)
                for side in order:
                    started = time.perf_counter()
                    output = run_side(side, server_options, base)
                    for label in record(side, output):
                        if label not in labels:
                            labels.append(label)
                    print(f"round {turn + 1} {side.name:<6} "
                          f"({time.perf_counter() - started:5.1f} s): " + "; ".join(
                              f"{label} {values[-1][0]:.2f}x"
                              for label, values in side.ratios.items()), flush=True)
        except Failed as failure:
            print(f"FAILED: {failure}", flush=True)
            sys.exit(1)
    table(labels, before, after)


if __name__ == "__main__":
    main()
