"""Every ```python block in the README and docs runs on its own.

Each block is run in a fresh namespace, as a reader who copies just that block would
run it: no block may depend on an earlier one. ``FlowServer.serve`` is replaced so
that blocks which start a server return at once. The page-specific tests check what
the blocks print and do.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chainweaver.mcp import FlowServer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks() -> list[tuple[str, int, str]]:
    """(page, line number, code) for every python block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
            line = text.count("\n", 0, match.start()) + 2
            found.append((str(page.relative_to(ROOT)), line, match.group(1)))
    return found


BLOCKS = python_blocks()


def test_there_are_blocks_to_run() -> None:
    assert len(BLOCKS) >= 20


@pytest.mark.parametrize(("page", "line", "code"), BLOCKS,
                         ids=[f"{page}:{line}" for page, line, _ in BLOCKS])
def test_each_python_block_runs_on_its_own(
    page: str, line: int, code: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(FlowServer, "serve", lambda self, *args, **kwargs: None)
    monkeypatch.chdir(ROOT)
    # Line numbers in tracebacks point into the page.
    compiled = compile("\n" * (line - 1) + code, str(ROOT / page), "exec")
    exec(compiled, {"__name__": "__docs__"})
    capsys.readouterr()
