"""`chainweaver install claude-desktop|cursor|vscode|json`: the entry lands in the file
each client reads, in its format (mcpServers, or VS Code's servers with a type), merged
without losing other servers or settings; it runs this environment's Python with
absolute paths; and the entry, started as a client starts it (from another folder, with
only its own environment), serves the flows."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from support.cli import run

from chainweaver.cli.install import app_config_dir

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "examples/flows"
TOOLS = "examples/flow_tools.py"
EXPOSED = ["help_search", "order_status", "order_total"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home folder of its own (HOME and XDG_CONFIG_HOME), commands run from the
    repository root."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return home


def read(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def check_command(entry: dict[str, Any]) -> None:
    """This environment's Python (not resolved through the venv's symlink), absolute
    paths, and the serve command."""
    assert entry["command"] == os.path.abspath(sys.executable)
    assert Path(entry["command"]).is_absolute()
    assert entry["args"][:5] == ["-m", "chainweaver", "serve", str(ROOT / FLOWS), "--tools"]
    assert entry["args"][5] == str(ROOT / TOOLS)


async def served_by(entry: dict[str, Any], elsewhere: Path) -> list[str]:
    """Start the entry as a client does: from another folder, with only its env."""
    elsewhere.mkdir(exist_ok=True)
    transport = StdioTransport(entry["command"], entry["args"], env=entry.get("env") or {},
                               cwd=str(elsewhere), keep_alive=False,
                               log_file=elsewhere / "server.log")
    async with Client(transport) as client:
        return sorted(tool.name for tool in await client.list_tools())


# ------------------------------------------------------------------ each client's file


@pytest.mark.anyio
async def test_claude_desktop_gets_an_mcp_servers_entry_beside_its_other_servers(
    capsys: pytest.CaptureFixture, home: Path, tmp_path: Path,
) -> None:
    folder = home / ".config" / "Claude"
    folder.mkdir(parents=True)
    config = folder / "claude_desktop_config.json"
    config.write_text(json.dumps({"globalShortcut": "Ctrl+Space", "mcpServers": {
        "files": {"command": "npx", "args": ["-y", "server-files", "/tmp"]}}}))
    code, out, err = run(capsys, "install", "claude-desktop", FLOWS, "--tools", TOOLS,
                         "--name", "support-desk", "--expose-schemas", "--env",
                         "SHOP_REGION=eu")
    assert (code, out) == (0, "")
    assert err.splitlines()[-1] == (
        "chainweaver: added server 'support-desk' in Claude Desktop's configuration "
        "~/.config/Claude/claude_desktop_config.json: restart Claude Desktop to start it")
    document = read(config)
    assert document["globalShortcut"] == "Ctrl+Space"
    assert document["mcpServers"]["files"] == {"command": "npx",
                                               "args": ["-y", "server-files", "/tmp"]}
    entry = document["mcpServers"]["support-desk"]
    assert set(entry) == {"command", "args", "env"}
    check_command(entry)
    assert entry["args"][6:] == ["--expose-schemas", "--name", "support-desk"]
    assert entry["env"] == {"SHOP_REGION": "eu"}
    assert await served_by(entry, tmp_path / "client") == EXPOSED


def test_claude_desktop_must_have_run_once(capsys: pytest.CaptureFixture, home: Path
                                           ) -> None:
    code, _, err = run(capsys, "install", "claude-desktop", FLOWS, "--tools", TOOLS)
    assert code == 2
    assert err == (f"chainweaver: error: Claude Desktop's configuration folder "
                   f"{home}/.config/Claude does not exist: is it installed, and has it run "
                   "once? (--config FILE writes another file)\n")


@pytest.mark.parametrize(("platform", "expected"), [
    ("linux", ".config/Claude"), ("darwin", "Library/Application Support/Claude")])
def test_claude_desktop_folder_by_platform(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           platform: str, expected: str) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setattr(sys, "platform", platform)
    assert app_config_dir("Claude") == tmp_path / expected
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("APPDATA", str(tmp_path / "Roaming"))
    assert app_config_dir("Claude") == tmp_path / "Roaming" / "Claude"


@pytest.mark.anyio
async def test_cursor_global_and_workspace_files(capsys: pytest.CaptureFixture, home: Path,
                                                 tmp_path: Path) -> None:
    (home / ".cursor").mkdir()
    code, _, err = run(capsys, "install", "cursor", FLOWS, "--tools", TOOLS)
    assert code == 0, err
    entry = read(home / ".cursor" / "mcp.json")["mcpServers"]["chainweaver"]
    check_command(entry)
    assert "env" not in entry and "type" not in entry
    workspace = tmp_path / "project"
    workspace.mkdir()
    code, _, err = run(capsys, "install", "cursor", FLOWS, "--tools", TOOLS, "--workspace",
                       str(workspace))
    assert code == 0, err
    assert read(workspace / ".cursor" / "mcp.json")["mcpServers"]["chainweaver"] == entry
    assert await served_by(entry, tmp_path / "client") == EXPOSED


@pytest.mark.anyio
async def test_vscode_workspace_file_has_servers_with_a_type(
    capsys: pytest.CaptureFixture, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    tools = str(ROOT / TOOLS)
    monkeypatch.chdir(workspace)  # the default workspace: the current folder
    code, _, err = run(capsys, "install", "vscode", str(ROOT / FLOWS), "--tools", tools,
                       "--lifecycle", "active,draft")
    assert code == 0, err
    document = read(workspace / ".vscode" / "mcp.json")
    assert list(document) == ["servers"]
    entry = document["servers"]["chainweaver"]
    assert entry["type"] == "stdio"
    check_command(entry)
    assert entry["args"][6:] == ["--lifecycle", "active,draft"]
    assert await served_by(entry, tmp_path / "client") == ["churn_risk", *EXPOSED]


def test_vscode_user_profile_file(capsys: pytest.CaptureFixture, home: Path) -> None:
    profile = home / ".config" / "Code" / "User"
    profile.mkdir(parents=True)
    code, _, err = run(capsys, "install", "vscode", FLOWS, "--tools", TOOLS, "--user")
    assert code == 0, err
    assert read(profile / "mcp.json")["servers"]["chainweaver"]["type"] == "stdio"


def test_json_prints_the_entry_and_writes_nothing(capsys: pytest.CaptureFixture, home: Path
                                                  ) -> None:
    code, out, err = run(capsys, "install", "json", FLOWS, "--tools", TOOLS, "--name", "desk",
                         "--no-run-notifications", "--flow-timeout", "30")
    assert code == 0, err
    (name, entry), = json.loads(out).items()
    assert name == "desk"
    check_command(entry)
    assert entry["args"][6:] == ["--name", "desk", "--flow-timeout", "30",
                                 "--no-run-notifications"]
    assert list(home.iterdir()) == []


# ------------------------------------------------------------------ merging, refusing


def test_an_existing_entry_is_updated_keeping_its_own_settings(
    capsys: pytest.CaptureFixture, home: Path, tmp_path: Path,
) -> None:
    config = tmp_path / "any.json"
    config.write_text(json.dumps({"mcpServers": {"chainweaver": {
        "command": "old", "args": [], "disabled": False, "env": {"KEEP": "1", "A": "old"}},
        "other": {"url": "http://127.0.0.1:9/mcp"}}}, indent=4))
    config.chmod(0o640)
    code, _, err = run(capsys, "install", "claude-desktop", FLOWS, "--tools", TOOLS,
                       "--config", str(config), "--env", "A=new")
    assert code == 0, err
    assert "chainweaver: updated server 'chainweaver'" in err
    document = read(config)
    entry = document["mcpServers"]["chainweaver"]
    check_command(entry)
    assert entry["disabled"] is False
    assert entry["env"] == {"KEEP": "1", "A": "new"}
    assert document["mcpServers"]["other"] == {"url": "http://127.0.0.1:9/mcp"}
    assert stat.S_IMODE(config.stat().st_mode) == 0o640  # its permissions kept


def test_a_new_file_holding_environment_values_is_private(
    capsys: pytest.CaptureFixture, home: Path, tmp_path: Path,
) -> None:
    env_file = tmp_path / "shop.env"
    env_file.write_text("# the shop's settings\nexport SHOP_TOKEN='t0k3n'\nREGION=eu\n")
    config = tmp_path / "new" / "mcp.json"
    code, _, err = run(capsys, "install", "cursor", FLOWS, "--tools", TOOLS, "--config",
                       str(config), "--env-file", str(env_file), "--env", "REGION=us")
    assert code == 0, err
    assert read(config)["mcpServers"]["chainweaver"]["env"] == {"SHOP_TOKEN": "t0k3n",
                                                                "REGION": "us"}
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


@pytest.mark.parametrize("text", ['{\n  // my servers\n  "servers": {}\n}\n', "[1, 2]\n",
                                  '{"servers": []}'])
def test_a_file_it_cannot_read_as_a_configuration_is_left_unchanged(
    capsys: pytest.CaptureFixture, home: Path, tmp_path: Path, text: str,
) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(text)
    code, _, err = run(capsys, "install", "vscode", FLOWS, "--tools", TOOLS, "--config",
                       str(config))
    assert code == 1
    assert err.startswith(f"chainweaver: error: {config}: not ")
    assert "left unchanged" in err
    assert config.read_text() == text


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--transport", "streamable-http"], 2, "install starts the server over stdio"),
    (["--port", "9000"], 2, "--port only applies to --transport streamable-http"),
    (["--env", "NOEQUALS"], 2, "--env 'NOEQUALS': not KEY=VALUE"),
    (["--lifecycle", "live"], 1, "--lifecycle: 'live' is not one of"),
])
def test_what_serve_would_refuse_writes_nothing(
    capsys: pytest.CaptureFixture, home: Path, tmp_path: Path, argv: list[str], code: int,
    message: str,
) -> None:
    config = tmp_path / "claude.json"
    result, out, err = run(capsys, "install", "claude-desktop", FLOWS, "--tools", TOOLS,
                           "--config", str(config), *argv)
    assert (result, out) == (code, "")
    assert err.startswith(f"chainweaver: error: {message}")
    assert not config.exists()


def test_a_tools_module_found_in_the_current_folder_is_put_on_pythonpath(
    capsys: pytest.CaptureFixture, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "desk_tools.py").write_text((ROOT / TOOLS).read_text().replace(
        "flow_tools", "desk_tools"))
    (project / "flows").mkdir()
    (project / "flows" / "help.flow.json").write_text(
        (ROOT / FLOWS / "help_search.flow.json").read_text().replace("flow_tools",
                                                                     "desk_tools"))
    monkeypatch.chdir(project)
    monkeypatch.delitem(sys.modules, "desk_tools", raising=False)
    try:
        code, out, err = run(capsys, "install", "json", "flows", "--tools", "desk_tools")
    finally:
        sys.modules.pop("desk_tools", None)
    assert code == 0, err
    entry = json.loads(out)["chainweaver"]
    assert entry["args"][3:6] == [str(project / "flows"), "--tools", "desk_tools"]
    assert entry["env"] == {"PYTHONPATH": str(project)}
