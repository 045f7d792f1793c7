"""`chainweaver dev`: checks the flows as serve does, then starts the MCP Inspector
through npx on `chainweaver serve` (stdio, --watch, absolute paths, this environment's
Python) with the environment and ports asked for. Up to the Inspector's start with an
`npx` that records what it was given; with Node.js, the real Inspector starts too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from support.inspector import inspector_folder
from support.procs import STARTUP_TIMEOUT, free_port, stop

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHAINWEAVER = str(BIN / "chainweaver")
FLOWS = "examples/flows"
TOOLS = "examples/flow_tools.py"
EXPOSED = ["help_search", "order_status", "order_total"]

FAKE_NPX = """\
#!{python}
import json, os, sys
with open(os.environ["NPX_RECORD"], "w") as record:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {{k: os.environ.get(k) for k in ("CLIENT_PORT", "SERVER_PORT")}}}},
              record)
sys.exit(int(os.environ.get("NPX_EXIT", "0")))
"""


def fake_npx(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH finds an npx that records its arguments."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "npx").write_text(FAKE_NPX.format(python=sys.executable))
    (bin_dir / "npx").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{BIN}",
            "NPX_RECORD": str(tmp_path / "npx.json")}


def dev(env: dict[str, str], *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([CHAINWEAVER, "dev", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=STARTUP_TIMEOUT)


def server_of(recorded: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The server command and the -e environment the Inspector was given."""
    argv = recorded["argv"]
    separator = argv.index("--")
    options = argv[2:separator]
    env = dict(value.split("=", 1) for flag, value in zip(options[::2], options[1::2],
                                                          strict=True) if flag == "-e")
    return argv[separator + 1:], env


@pytest.mark.anyio
async def test_dev_starts_the_inspector_on_chainweaver_serve(tmp_path: Path) -> None:
    env = fake_npx(tmp_path)
    done = dev(env, FLOWS, "--tools", TOOLS, "--expose-prompts", "--env", "SHOP_REGION=eu",
               "--ui-port", "7001", "--server-port", "7002", "--inspector-version", "2.12.0")
    assert done.returncode == 0, done.stderr
    recorded = json.loads((tmp_path / "npx.json").read_text())
    assert recorded["argv"][:2] == ["--yes", "@modelcontextprotocol/inspector@2.12.0"]
    assert recorded["env"] == {"CLIENT_PORT": "7001", "SERVER_PORT": "7002"}
    command, server_env = server_of(recorded)
    assert server_env == {"SHOP_REGION": "eu"}
    # This environment's Python (the console script's: python or python3 in its bin).
    assert Path(command[0]).parent == BIN and Path(command[0]).name.startswith("python")
    assert command[1:] == ["-m", "chainweaver", "serve", str(ROOT / FLOWS), "--tools",
                           str(ROOT / TOOLS), "--expose-prompts", "--watch"]
    assert "chainweaver: exposed 3 of 6 flows" in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "chainweaver: starting the MCP Inspector (@modelcontextprotocol/inspector@2.12.0) on: ")
    # What the Inspector starts serves the flows, from any folder, with only that env.
    elsewhere = tmp_path / "inspector-cwd"
    elsewhere.mkdir()
    transport = StdioTransport(command[0], command[1:], env=server_env, cwd=str(elsewhere),
                               keep_alive=False, log_file=tmp_path / "server.log")
    async with Client(transport) as client:
        assert sorted(t.name for t in await client.list_tools()) == EXPOSED
        assert "order_status__customer_reply" in {p.name for p in await client.list_prompts()}


def test_no_watch_and_the_inspectors_exit_status(tmp_path: Path) -> None:
    env = {**fake_npx(tmp_path), "NPX_EXIT": "5"}
    done = dev(env, FLOWS, "--tools", TOOLS, "--no-watch")
    assert done.returncode == 5  # the Inspector's
    recorded = json.loads((tmp_path / "npx.json").read_text())
    assert recorded["argv"][1] == "@modelcontextprotocol/inspector"
    assert recorded["env"] == {"CLIENT_PORT": None, "SERVER_PORT": None}
    command, _ = server_of(recorded)
    assert "--watch" not in command


def test_flows_that_do_not_load_never_start_the_inspector(tmp_path: Path) -> None:
    env = fake_npx(tmp_path)
    done = dev(env, FLOWS, "--tools", "examples/no_such_tools.py")
    assert done.returncode == 2
    assert done.stderr == ("chainweaver: error: --tools examples/no_such_tools.py: no such "
                           "file\n")
    assert not (tmp_path / "npx.json").exists()


def test_without_node_it_says_what_is_missing(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(BIN)}  # no npx
    done = dev(env, FLOWS, "--tools", TOOLS)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "chainweaver: error: dev needs Node.js: npx is not on PATH (the MCP Inspector is "
        "the npm package @modelcontextprotocol/inspector); without it, run chainweaver "
        "serve and connect any MCP client")


def test_the_real_inspector_starts_on_the_flows(tmp_path: Path) -> None:
    folder, version = inspector_folder()
    ui_port, server_port = free_port(), free_port()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "MCP_AUTO_OPEN_ENABLED": "false"}
    log = tmp_path / "dev.log"
    with open(log, "w") as output:
        # From the folder the Inspector is installed in: npx uses that copy, offline.
        process = subprocess.Popen(
            [CHAINWEAVER, "dev", str(ROOT / FLOWS), "--tools", str(ROOT / TOOLS),
             "--inspector-version", version, "--ui-port", str(ui_port), "--server-port",
             str(server_port)], cwd=folder, env=env, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while "is up and running" not in log.read_text():
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            page = urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/", timeout=30)
            assert page.status == 200
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # the Inspector and what it started
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop(process)
    text = log.read_text()
    assert "chainweaver: exposed 3 of 6 flows" in text
    assert f"http://127.0.0.1:{ui_port}" in text

