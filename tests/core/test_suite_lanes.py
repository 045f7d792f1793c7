"""The suite runs without the tasks extra too (CI's newest lane): every test file that
imports the extra's packages at module level is listed in conftest's TASK_TEST_FILES, so
that lane skips collecting it instead of failing on the import."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import TASK_TEST_FILES

TESTS = Path(__file__).resolve().parents[1]
EXTRA_PACKAGES = {"redis", "fastmcp_tasks", "docket"}
# Test helpers that import the extra themselves.
EXTRA_HELPERS = {"support.task_asks", "servers.task_tools"}


def imports_the_extra(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in EXTRA_PACKAGES or name in EXTRA_HELPERS:
                return True
    return False


def test_every_test_file_that_imports_the_tasks_extra_is_listed() -> None:
    needing = {path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")
               if imports_the_extra(path)}
    assert needing, "the scan found no task test file at all"
    assert needing - set(TASK_TEST_FILES) == set()


def test_every_listed_file_exists() -> None:
    assert [name for name in TASK_TEST_FILES if not (TESTS / name).is_file()] == []
