"""Every install instruction installs this project: the `chainweaver` on PyPI is another
one (the reference package), so no doc, example or message tells users to install
`chainweaver` from the index, and the README says what the test install does to the
main job's FastMCP."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "examples").rglob("*.py")), ROOT / "benchmarks" / "README.md"]
# What users read in messages: the package's own source.
SOURCES = sorted((ROOT / "chainweaver").rglob("*.py"))
# `pip install chainweaver`, `pip install 'chainweaver[mcp]'`, `pip install -U
# "chainweaver>=0.1"`, `uv pip install chainweaver`: the name, from the index.
FROM_THE_INDEX = re.compile(r"pip\s+install\s+(?:-[-\w]+\s+)*['\"]?chainweaver(?![\w/.-])")


def test_the_check_catches_each_spelling() -> None:
    for text in ("pip install chainweaver", "pip install 'chainweaver[mcp]'",
                 'pip install -U "chainweaver>=0.1"', "uv pip install --upgrade chainweaver"):
        assert FROM_THE_INDEX.search(text), text
    for text in ("pip install -e '.[mcp]'", "pip install chainweaver-tools",
                 "pip install ./chainweaver", "pip install opentelemetry-sdk"):
        assert not FROM_THE_INDEX.search(text), text


@pytest.mark.parametrize("path", DOCS + SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_installs_chainweaver_from_the_index(path: Path) -> None:
    found = [line.strip() for line in path.read_text().splitlines()
             if FROM_THE_INDEX.search(line)]
    assert found == []


def test_getting_started_says_the_index_name_is_another_project() -> None:
    text = " ".join((ROOT / "docs" / "getting-started.md").read_text().split())
    assert "the package named `chainweaver` on PyPI is another project" in text
    assert "pip install -e '.[mcp]'" in text


def test_the_readme_says_the_test_install_moves_fastmcp_back() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "the `chainweaver` on PyPI is another project" in text
    assert ("The test install, run in the main job's environment, moves FastMCP back from "
            "the newest 4.x to 4.1.x") in text
    assert "`chainweaver --version` shows the FastMCP and MCP SDK versions in use" in text
