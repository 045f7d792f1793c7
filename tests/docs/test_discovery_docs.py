"""docs/discovery.md stays true: each python block prints what the page says it prints,
each console command prints exactly what the page shows (the card it writes validates
against the server-card schema), and the page is linked from the index and README."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from support.procs import STARTUP_TIMEOUT
from support.server_card import check_card, check_registry_entry, tool_names

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "discovery.md"
BIN = Path(sys.executable).parent
# What each python block prints, in page order, as the page says it.
PRINTED = ["200 ['search_help']\n304\n200 True", "30000 public", "True"]
EXPOSED = {"help_search", "order_status", "order_total"}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.DOTALL)


def sandbox(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_each_python_block_prints_what_the_page_says(tmp_path: Path) -> None:
    text = PAGE.read_text()
    codes = blocks("python")
    assert len(codes) == len(PRINTED)
    env = sandbox(tmp_path)
    for code, printed in zip(codes, PRINTED, strict=True):
        assert printed in text or f"```text\n{printed}\n```" in text
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == printed


def test_the_console_examples_print_what_the_page_shows(tmp_path: Path) -> None:
    env = sandbox(tmp_path)
    examples = [chunk.partition("\n") for content in blocks("console")
                for chunk in re.split(r"^\$ ", content, flags=re.MULTILINE)[1:]]
    assert len(examples) == 2
    for command, _, output in examples:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=STARTUP_TIMEOUT)
        assert done.returncode == 0, done.stdout
        assert done.stdout.rstrip("\n") == output.rstrip("\n"), command
    card = json.loads((tmp_path / "card.json").read_text())
    check_card(card)
    assert tool_names(card) == EXPOSED
    entry = json.loads(examples[1][2])
    check_registry_entry(entry)


def test_the_page_is_linked_from_the_index_and_the_readme() -> None:
    assert "(discovery.md)" in (ROOT / "docs" / "index.md").read_text()
    assert "(docs/discovery.md)" in (ROOT / "README.md").read_text()
