"""README.md stays true: its Python examples run, its set-up commands match .ci/run."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from chainweaver.mcp import FlowServer

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.DOTALL)


def test_python_examples_run(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    served = []
    monkeypatch.setattr(FlowServer, "serve", lambda self, *a, **k: served.append((a, k)))
    namespace: dict = {}
    for code in blocks("python"):
        exec(compile(code, "README.md", "exec", dont_inherit=True), namespace)
    output, errors = capsys.readouterr()
    assert "{'summary': 'Order A-1001 is shipped.'}" in output
    # The MCP snippet serves on stdio, so its report goes to stderr, never stdout.
    assert "order_summary exposed" in errors
    assert "order_summary exposed" not in output
    assert served == [((), {})]


def test_setup_commands_are_what_ci_runs() -> None:
    commands = blocks("bash")
    assert len(commands) == 2
    main_job, tests = (c.strip() for c in commands)
    assert main_job.endswith("python examples/mcp_flow_server.py --demo")
    ci = (ROOT / ".ci" / "run").read_text()
    install = re.search(r"pip install (-e '\.\[[^\]]+\]')", tests).group(1)
    # Verbatim, with the pip the venv ships: CI must not upgrade pip first.
    assert f"pip install {install}" in ci.splitlines()
    assert "--upgrade pip" not in ci
    test_command = tests.split("&& ", 3)[-1].split("&& ")[-1]
    assert test_command in ci


def test_client_configurations_are_valid_json() -> None:
    configs = [json.loads(text) for text in blocks("json")]
    assert configs[0]["mcpServers"]["chainweaver"]["args"][0].endswith("mcp_flow_server.py")
    assert configs[1]["servers"]["chainweaver"]["type"] == "stdio"


def test_the_python_floor_is_stated_where_users_and_ci_read_it() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = re.fullmatch(r">=(\d+\.\d+)", declared["requires-python"]).group(1)
    assert f"Python {floor} or newer" in README
    assert f"Python {floor} or newer" in (ROOT / "docs" / "getting-started.md").read_text()
    assert f'`requires-python = ">={floor}"`' in (ROOT / "docs" / "dependencies.md").read_text()
    # The lowest lane runs on the floor: .ci/run reads it from pyproject.toml itself.
    assert '["requires-python"]' in (ROOT / ".ci" / "run").read_text()
