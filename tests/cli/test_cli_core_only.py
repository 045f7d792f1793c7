"""A core-only install (``pip install -e .``): every command and module the docs call
core works without an extra, and a command that needs one says which, in one line.

Each command runs in a subprocess that cannot import any extra's package (see
support/core_only.py): what a fresh ``pip install -e .`` has.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.core_only import core_only_env
from support.procs import STARTUP_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
JSON_FLOW = "examples/flows/help_search.flow.json"
TOOLS = "examples/flow_tools.py"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return core_only_env(tmp_path_factory.mktemp("core-only"))


def python(env: dict[str, str], *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=STARTUP_TIMEOUT)


def chainweaver(env: dict[str, str], *argv: str, cwd: Path = ROOT
                ) -> subprocess.CompletedProcess:
    return python(env, "-m", "chainweaver", *argv, cwd=cwd)


def test_the_subprocess_has_no_extra_but_has_the_core(env: dict[str, str]) -> None:
    probe = textwrap.dedent("""
        import importlib
        for name in ("fastmcp", "mcp", "anyio", "redis", "yaml", "opentelemetry",
                     "jsonschema", "pytest"):
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                continue
            print("importable:", name)
        import chainweaver, pydantic
        print("core", chainweaver.__version__)
    """)
    completed = python(env, "-c", probe)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == [f"core {__import__('chainweaver').__version__}"]


def test_version_says_which_extras_are_not_installed(env: dict[str, str]) -> None:
    completed = chainweaver(env, "--version")
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("chainweaver ")
    assert "fastmcp not installed (mcp extra)" in lines
    assert "mcp not installed (mcp extra)" in lines
    assert "pyyaml not installed (yaml extra)" in lines


def test_schema_prints_the_flow_file_schema(env: dict[str, str]) -> None:
    completed = chainweaver(env, "schema")
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["$schema"].startswith("https://json-schema.org/")


def test_validate_checks_json_flow_files_against_the_tools(env: dict[str, str]) -> None:
    completed = chainweaver(env, "validate", JSON_FLOW, "--tools", TOOLS)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "1 flow file(s) checked: no problems\n"


def test_run_runs_a_flow(env: dict[str, str]) -> None:
    completed = chainweaver(env, "run", "help_search", JSON_FLOW, "--tools", TOOLS,
                            "--input", '{"query": "refund"}')
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["articles"]
    assert "search_help_articles" in completed.stderr


def test_inspect_graph_draws_a_flow(env: dict[str, str]) -> None:
    completed = chainweaver(env, "inspect", JSON_FLOW, "--tools", TOOLS, "--graph",
                            "help_search")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("flowchart TD\n")


def test_migrate_converts_json_reference_flows(env: dict[str, str], tmp_path: Path) -> None:
    # Its models are support.migrate_corpus's, imported from the folder it runs in.
    source = ROOT / "tests" / "cli" / "migrate_corpus" / "routing.flow.json"
    completed = chainweaver(env, "migrate", str(source), "--out", str(tmp_path),
                            cwd=ROOT / "tests")
    assert completed.returncode == 0, completed.stderr
    assert (tmp_path / "routing.flow.json").is_file()


def test_the_testing_module_runs_a_flow(env: dict[str, str]) -> None:
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, "examples")
        import flow_tools
        from chainweaver.testing import FakeTool, run_flow

        search = FakeTool(flow_tools.search_help_articles, {{"articles": [], "article_ids": []}})
        run = run_flow({JSON_FLOW!r}, {{"query": "refund"}}, tools=[search])
        run.assert_succeeded()
        search.assert_called(1)
        print("ok")
    """)
    completed = python(env, "-c", code)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "ok\n"


def test_the_engine_quickstart_runs(env: dict[str, str]) -> None:
    completed = python(env, "examples/engine_quickstart.py")
    assert completed.returncode == 0, completed.stderr


HINT = "in a clone of ChainWeaver"


@pytest.mark.parametrize(("argv", "says"), [
    (["serve", JSON_FLOW, "--tools", TOOLS], "chainweaver serve needs the mcp extra"),
    (["inspect", JSON_FLOW, "--tools", TOOLS], "chainweaver inspect needs the mcp extra"),
    (["worker", JSON_FLOW, "--tools", TOOLS, "--tasks", "redis://127.0.0.1:1/0"],
     "chainweaver worker needs the mcp extra"),
    (["install", "json", JSON_FLOW, "--tools", TOOLS],
     "chainweaver install needs the mcp extra"),
    (["dev", JSON_FLOW, "--tools", TOOLS], "chainweaver dev needs the mcp extra"),
    (["flows", "status", "--governance", "redis://127.0.0.1:1/0"],
     "chainweaver flows needs the tasks extra"),
    (["runs", "list", "--store", "redis://127.0.0.1:1/0"],
     "chainweaver runs needs the mcp extra and the tasks extra"),
    (["validate", "examples/flows"], "YAML flow files need PyYAML"),
], ids=lambda value: value[0] if isinstance(value, list) else None)
def test_a_command_that_needs_an_extra_says_which_in_one_line(
    env: dict[str, str], argv: list[str], says: str,
) -> None:
    completed = chainweaver(env, *argv)
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert completed.stderr.count("\n") == 1, completed.stderr
    assert completed.stderr.startswith(f"chainweaver: error: {says}")
    assert HINT in completed.stderr
