"""The MCP Inspector (an npm package), installed into ``.cache/`` once for the test that
starts it through ``chainweaver dev``; skipped, saying so, without Node.js and npm."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSPECTOR_VERSION = "2.12.0"
INSPECTOR_DIR = ROOT / ".cache" / f"inspector-{INSPECTOR_VERSION}"
INSTALL_TIMEOUT = 300.0


def inspector_folder() -> tuple[Path, str]:
    """A folder where ``npx @modelcontextprotocol/inspector@VERSION`` finds the package
    installed (npx uses a project's own copy), and the version."""
    if shutil.which("node") is None or shutil.which("npm") is None \
            or shutil.which("npx") is None:
        pytest.skip("node, npm and npx are not installed: the MCP Inspector is an npm "
                    "package (tests/cli/test_cli_dev.py checks everything up to starting "
                    "it with an npx that records its arguments)")
    package = INSPECTOR_DIR / "node_modules" / "@modelcontextprotocol" / "inspector"
    if not (package / "package.json").is_file():
        INSPECTOR_DIR.mkdir(parents=True, exist_ok=True)
        installed = subprocess.run(
            [shutil.which("npm") or "npm", "install", "--prefix", str(INSPECTOR_DIR),
             "--no-audit", "--no-fund", "--no-save",
             f"@modelcontextprotocol/inspector@{INSPECTOR_VERSION}"],
            capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
        assert installed.returncode == 0, installed.stderr
    return INSPECTOR_DIR, INSPECTOR_VERSION
