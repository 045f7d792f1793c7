"""docs/clients.md stays true: its commands run as written, in a sandbox whose home
folder has Claude Desktop's folder (so no real configuration is touched), and print
what the page shows; the file the Claude Desktop example writes is the JSON shown; the
`dev` example starts an Inspector (a stand-in npx that records its arguments) on the
command shown."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.procs import STARTUP_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "clients.md"
BIN = Path(sys.executable).parent
PLACEHOLDER = "/path/to/chainweaver"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.DOTALL)


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder where `examples/` is the repository's, and an environment whose home
    folder is the sandbox's own, with Claude Desktop's folder in it."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    home = tmp_path / "home"
    (home / ".config" / "Claude").mkdir(parents=True)
    env = {key: value for key, value in os.environ.items() if key != "XDG_CONFIG_HOME"}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return tmp_path, env


def shown(value: Any, sandbox: Path) -> Any:
    """A real entry as the page shows it: this environment's Python and the sandbox
    spelled as the placeholder path."""
    if isinstance(value, dict):
        return {key: shown(item, sandbox) for key, item in value.items()}
    if isinstance(value, list):
        return [shown(item, sandbox) for item in value]
    if isinstance(value, str) and Path(value).parent == BIN and \
            Path(value).name.startswith("python"):
        return f"{PLACEHOLDER}/.venv/bin/python"
    return value.replace(str(sandbox), PLACEHOLDER) if isinstance(value, str) else value


def test_the_console_examples_print_what_the_page_shows(
    sandbox: tuple[Path, dict[str, str]],
) -> None:
    folder, env = sandbox
    examples = [chunk.partition("\n") for content in blocks("console")
                for chunk in re.split(r"^\$ ", content, flags=re.MULTILINE)[1:]]
    assert len(examples) == 3
    for command, _, output in examples:
        done = subprocess.run(["bash", "-c", command], cwd=folder, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=STARTUP_TIMEOUT)
        assert done.returncode == 0, done.stdout
        assert done.stdout.rstrip("\n") == output.rstrip("\n"), command
    # The Claude Desktop example wrote the entry the page shows.
    (document,) = [json.loads(text) for text in blocks("json")]
    written = json.loads((folder / "home" / ".config" / "Claude" /
                          "claude_desktop_config.json").read_text())
    assert shown(written, folder) == document
    assert json.loads((folder / ".vscode" / "mcp.json").read_text())["servers"][
        "support-desk"]["type"] == "stdio"


def test_the_dev_example_starts_the_inspector_on_the_command_shown(
    sandbox: tuple[Path, dict[str, str]],
) -> None:
    folder, env = sandbox
    (example,) = [text for text in blocks("text") if text.startswith("$ chainweaver dev ")]
    command, *printed = example.strip().splitlines()
    fake = folder / "fake-bin"
    fake.mkdir()
    (fake / "npx").write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                              "json.dump(sys.argv[1:], open(os.environ['NPX_RECORD'], 'w'))\n")
    (fake / "npx").chmod(0o755)
    env = {**env, "PATH": f"{fake}{os.pathsep}{env['PATH']}",
           "NPX_RECORD": str(folder / "npx.json")}
    done = subprocess.run(shlex.split(command[2:]), cwd=folder, env=env,
                          capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[:-1] == printed[:-1]
    started, on = lines[-1].split(" on: ")
    assert f"{started} on: {' '.join(shown(on.split(' '), folder))}" == printed[-1]
    argv = json.loads((folder / "npx.json").read_text())
    assert argv[:3] == ["--yes", "@modelcontextprotocol/inspector", "--"]
    assert shown(argv[3:], folder) == printed[-1].split(" on: ")[1].split(" ")
