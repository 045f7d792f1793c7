"""The MCP conformance suite (an npm package), installed into ``.cache/`` once and
shared by the tests that run its scenarios against ``chainweaver serve``."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = "@modelcontextprotocol/conformance@0.1.13"
CONFORMANCE_DIR = ROOT / ".cache" / "conformance-0.1.13"
CONFORMANCE_TIMEOUT = 300.0


def conformance_command(without_node: str) -> list[str]:
    """The command that runs the suite (installed on first use). Without node and npm
    the calling test is skipped, giving ``without_node`` as what covers it instead."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed: the MCP conformance suite is an npm "
                    f"package ({without_node})")
    entry = CONFORMANCE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / \
        "dist" / "index.js"
    CONFORMANCE_DIR.mkdir(parents=True, exist_ok=True)
    # One install at a time: the suite's two workers may both need it first.
    with open(CONFORMANCE_DIR / ".install-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not entry.is_file():
            installed = subprocess.run(
                [npm, "install", "--prefix", str(CONFORMANCE_DIR), "--no-audit",
                 "--no-fund", "--no-save", CONFORMANCE], capture_output=True, text=True,
                timeout=CONFORMANCE_TIMEOUT)
            assert installed.returncode == 0, installed.stderr
    return [node, str(entry)]
