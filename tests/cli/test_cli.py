"""`chainweaver serve` and `chainweaver inspect`: real servers over stdio and streamable
HTTP in subprocesses, the exposure report as a table and as JSON, and every bad input
with its exit code and a one-line message naming the file, field or flag."""

from __future__ import annotations

import importlib.metadata
import json
import os
import runpy
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastmcp
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from support.procs import EXIT_TIMEOUT, STARTUP_TIMEOUT, free_port, stop, wait_until_listening

from chainweaver import FlowExecutor, FlowRegistry, Tool, __version__, load_flows
from chainweaver.cli import main
from chainweaver.mcp import ExposurePolicy, FlowServer

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "examples/flows"
TOOLS = "examples/flow_tools.py"
BIN = Path(sys.executable).parent
CHAINWEAVER = shutil.which("chainweaver", path=str(BIN)) or str(BIN / "chainweaver")

EXPOSED = ["help_search", "order_status", "order_total"]
EXCLUDED = {"churn_risk": "lifecycle 'draft' is not allowed (allowed: active)",
            "legacy_ticket": "effective safety is unknown",
            "refund_order": "side effects 'write' are not allowed (allowed: none, read)"}
PROMPTS = ["chainweaver_guide", "help_search", "order_status", "order_status__customer_reply",
           "order_total"]
RESOURCES = ["chainweaver://flows"] + [f"chainweaver://flows/{n}/schema" for n in EXPOSED]


@pytest.fixture(autouse=True)
def in_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Run from the repository root; undo the sys.path entries and tmp modules a run adds."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        module_file = getattr(sys.modules[name], "__file__", None) or ""
        if module_file.startswith(str(tmp_path)):
            del sys.modules[name]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def reference_server(expose_schemas: bool = False, expose_prompts: bool = False,
                     **policy: Any) -> FlowServer:
    """The same flows and tools built with the library API, to compare the CLI against."""
    import flow_tools  # imported by an earlier CLI run, or from examples/ on sys.path

    executor = FlowExecutor(FlowRegistry())
    for value in vars(flow_tools).values():
        if isinstance(value, Tool):
            executor.register_tool(value)
    for flow in load_flows(ROOT / FLOWS, tools=executor.tools):
        executor.registry.register_flow(flow)
    return FlowServer(executor, expose_schemas=expose_schemas, expose_prompts=expose_prompts,
                      policy=ExposurePolicy(**policy))


# ------------------------------------------------------------------ inspect


def test_inspect_prints_the_exposure_decision_as_tables(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "inspect", FLOWS, "--tools", TOOLS,
                         "--expose-schemas", "--expose-prompts")
    assert (code, err) == (0, "")
    exposed_part, excluded_part, extras = out.strip().split("\n\n")
    exposed_lines = exposed_part.splitlines()
    assert exposed_lines[0] == "Exposed: 3 of 6 flows"
    assert exposed_lines[1].split() == ["FLOW", "VERSION", "TOOL", "RESOURCE", "PROMPTS"]
    rows = {line.split()[0]: line.split(maxsplit=4) for line in exposed_lines[2:]}
    assert sorted(rows) == EXPOSED
    assert rows["order_status"] == ["order_status", "2.0.0", "order_status",
                                    "chainweaver://flows/order_status/schema",
                                    "order_status, order_status__customer_reply"]
    assert rows["help_search"][1:4] == ["1.0.0", "help_search",
                                        "chainweaver://flows/help_search/schema"]
    excluded_lines = excluded_part.splitlines()
    assert excluded_lines[0] == "Excluded: 3 of 6 flows"
    assert excluded_lines[1].split() == ["FLOW", "VERSION", "REASON"]
    reasons = {line.split()[0]: line.split(maxsplit=2) for line in excluded_lines[2:]}
    assert sorted(reasons) == sorted(EXCLUDED)
    for name, reason in EXCLUDED.items():
        assert reasons[name][2].startswith(reason)
    assert reasons["churn_risk"][1] == "0.3.0"
    assert extras == ("Also published: resource chainweaver://flows (index), "
                      "prompt chainweaver_guide (guide)")


def test_inspect_without_expose_flags_shows_only_tools(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "inspect", FLOWS, "--tools", TOOLS)
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("order_status"))
    assert line.split() == ["order_status", "2.0.0", "order_status", "-", "-"]
    assert "Also published" not in out


def test_inspect_json_is_the_library_exposure_report(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--json",
                         "--expose-schemas", "--expose-prompts")
    assert (code, err) == (0, "")
    data = json.loads(out)
    reference = reference_server(expose_schemas=True, expose_prompts=True)
    assert data["flows"] == [entry.to_dict() for entry in reference.exposure_report()]
    assert data["tools"] == EXPOSED
    assert data["resources"] == RESOURCES
    assert data["prompts"] == sorted(PROMPTS)
    assert {f["flow_name"]: f["reason"] for f in data["flows"] if not f["exposed"]}.keys() \
        == EXCLUDED.keys()


@pytest.mark.parametrize(("flags", "policy", "tools"), [
    (["--lifecycle", "active", "--lifecycle", "draft"],
     {"allowed_lifecycles": ["active", "draft"]},
     ["churn_risk", *EXPOSED]),
    (["--side-effects", "none,read,write", "--allow-requires-approval"],
     {"allowed_side_effects": ["none", "read", "write"], "allow_requires_approval": True},
     [*EXPOSED, "refund_order"]),
    (["--side-effects", "none,read,write"], {"allowed_side_effects": ["none", "read", "write"]},
     EXPOSED),
    (["--owner", "support-team,docs-team"], {"owners": ["support-team", "docs-team"]},
     ["help_search", "order_status"]),
    (["--prefix", "shop"], {"server_prefix": "shop"}, [f"shop__{n}" for n in EXPOSED]),
])
def test_policy_flags_reach_the_exposure_decision(
    capsys: pytest.CaptureFixture, flags: list[str], policy: dict, tools: list[str],
) -> None:
    code, out, _ = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--json", *flags)
    assert code == 0
    data = json.loads(out)
    assert data["tools"] == tools
    assert data["flows"] == [e.to_dict() for e in reference_server(**policy).exposure_report()]


def test_tools_by_dotted_module_name(capsys: pytest.CaptureFixture, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "acme_support"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(textwrap.dedent("""
        from chainweaver import ToolSafetyContract, tool

        @tool(safety=ToolSafetyContract("read"))
        def lookup(order_id: str) -> dict:
            return {"found": order_id}

        _hidden = lookup  # private names are not scanned; the same object counts once
        also = lookup
    """))
    (tmp_path / "lookup.flow.yaml").write_text(
        "name: lookup\ndescription: Look up.\nsteps: [lookup]\n")
    monkeypatch.chdir(tmp_path)  # the CLI imports dotted modules from the current directory
    code, out, err = run(capsys, "inspect", ".", "--tools", "acme_support.tools", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["tools"] == ["lookup"]


def test_the_same_tools_file_twice_is_loaded_once(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--tools", TOOLS, "--json")
    assert code == 0
    assert json.loads(out)["tools"] == EXPOSED


def test_python_dash_m_entry_point(capsys: pytest.CaptureFixture,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["chainweaver", "--version"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("chainweaver", run_name="__main__")
    assert exited.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    # ChainWeaver's version, then the FastMCP and MCP SDK in use (the test install's).
    assert lines[:3] == [f"chainweaver {__version__}",
                         f"fastmcp {fastmcp.__version__} (mcp extra)",
                         f"mcp {importlib.metadata.version('mcp')} (mcp extra)"]
    assert f"pyyaml {importlib.metadata.version('pyyaml')} (yaml extra)" in lines


def test_version_says_not_installed_for_a_missing_extra(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "pyyaml not installed (yaml extra)" in capsys.readouterr().out.splitlines()


# ------------------------------------------------------------------ serve, in process


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[FlowServer, tuple, dict]]:
    calls: list[tuple[FlowServer, tuple, dict]] = []
    monkeypatch.setattr(FlowServer, "serve", lambda self, *a, **k: calls.append((self, a, k)))
    return calls


def test_serve_builds_everything_then_serves_with_the_transport_options(
    capsys: pytest.CaptureFixture, served: list,
) -> None:
    code, out, err = run(capsys, "serve", FLOWS, "--tools", TOOLS, "--transport",
                         "streamable-http", "--host", "0.0.0.0", "--port", "8123",
                         "--stateless", "--name", "support-desk", "--expose-prompts",
                         "--log-level", "warning")
    assert (code, out) == (0, "")
    ((server, args, options),) = served
    assert args == ("streamable-http",)
    assert options == {"host": "0.0.0.0", "port": 8123, "stateless": True,
                       "log_level": "WARNING"}
    assert server.fastmcp.name == "support-desk"
    assert server.registered_tool_names == EXPOSED
    assert "order_status__customer_reply" in server.prompt_names
    assert server.resource_uris == []
    summary = err.splitlines()
    assert summary[0] == "chainweaver: loaded 6 flow file(s) and 8 tool(s)"
    assert summary[1] == ("chainweaver: exposed 3 of 6 flows: help_search, order_status, "
                          "order_total")
    assert "chainweaver: excluded refund_order v1.0.0: side effects 'write'" in err
    assert summary[-2] == ("chainweaver: serving 3 tool(s), 0 resource(s), 5 prompt(s) on "
                           "http://0.0.0.0:8123/mcp")
    assert summary[-1] == ("chainweaver: warning: 0.0.0.0 is not a loopback address and no "
                           "--auth-token-file, --auth-jwks-uri or --auth-public-key is set: "
                           "anyone who can reach port 8123 can call the published flows")


def test_ctrl_c_stops_serve_with_exit_code_0(capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(self: FlowServer, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(FlowServer, "serve", interrupted)
    code, out, err = run(capsys, "serve", FLOWS, "--tools", TOOLS)
    assert (code, out) == (0, "")
    assert "Traceback" not in err and err.endswith("on stdio\n")


@pytest.mark.parametrize("command", [["inspect", "--json"], ["serve"]])
def test_what_a_tools_module_prints_while_loading_goes_to_stderr(
    capsys: pytest.CaptureFixture, served: list, tmp_path: Path, command: list[str],
) -> None:
    (tmp_path / "chatty_tools.py").write_text(textwrap.dedent("""
        from chainweaver import ToolSafetyContract, tool

        print("chatty_tools: connecting to the warehouse")

        @tool(safety=ToolSafetyContract("read"))
        def ping(order_id: str) -> dict:
            return {"ok": True}
    """))
    (tmp_path / "ping.flow.json").write_text(
        json.dumps({"name": "ping", "description": "Ping.", "steps": ["ping"]}))
    code, out, err = run(capsys, command[0], str(tmp_path), "--tools",
                         str(tmp_path / "chatty_tools.py"), *command[1:])
    assert code == 0
    assert "chatty_tools: connecting to the warehouse" in err
    if command[0] == "inspect":
        assert json.loads(out)["tools"] == ["ping"]  # stdout is nothing but the JSON
    else:
        assert out == "" and len(served) == 1


# ------------------------------------------------------------------ server settings


def _token_file(directory: Path, *tokens: str, mode: int = 0o600) -> Path:
    path = directory / "tokens.txt"
    path.write_text("# development tokens, one per line\n\n" + "\n".join(tokens) + "\n")
    path.chmod(mode)
    return path


def test_every_server_setting_has_a_flag(capsys: pytest.CaptureFixture, served: list,
                                         tmp_path: Path) -> None:
    from fastmcp.server.auth import StaticTokenVerifier

    tokens = _token_file(tmp_path, "tok-alice-1", "tok-bob-2")
    code, out, err = run(capsys, "serve", FLOWS, "--tools", TOOLS, "--error-detail", "generic",
                         "--flow-timeout", "2.5", "--page-size", "2", "--instructions",
                         "Use order_status first.", "--transport", "streamable-http",
                         "--allowed-host", "mcp.example.com:*", "--allowed-host",
                         "mcp.internal", "--allowed-origin", "https://app.example.com",
                         "--auth-token-file", str(tokens),
                         "--max-listen-streams-per-caller", "7", "--max-listen-streams", "70")
    assert (code, out) == (0, "")
    assert "warning" not in err
    ((server, _, _),) = served
    assert server.security.error_detail == "generic"
    assert server.serving.flow_timeout == 2.5
    assert server.serving.page_size == 2
    assert server.security.allowed_hosts == ("mcp.example.com:*", "mcp.internal")
    assert server.security.allowed_origins == ("https://app.example.com",)
    assert (server.security.max_listen_streams_per_caller,
            server.security.max_listen_streams) == (7, 70)
    assert (server._notifier.max_streams_per_caller, server._notifier.max_streams) == (7, 70)
    assert server.fastmcp.instructions == "Use order_status first."
    auth = server.fastmcp.auth
    assert isinstance(auth, StaticTokenVerifier) and server.security.auth is auth
    assert auth.tokens == {"tok-alice-1": {"client_id": "token-3", "scopes": []},
                           "tok-bob-2": {"client_id": "token-4", "scopes": []}}


def test_defaults_are_the_library_defaults(capsys: pytest.CaptureFixture, served: list) -> None:
    code, _, _ = run(capsys, "serve", FLOWS, "--tools", TOOLS)
    assert code == 0
    ((server, args, options),) = served
    reference = FlowServer(server.executor)
    assert server.security == reference.security
    assert server.serving == reference.serving
    assert server.fastmcp.instructions is None and server.fastmcp.auth is None
    assert (args, options) == (("stdio",), {"host": "127.0.0.1", "port": 8000,
                                             "stateless": False, "log_level": None})


def test_instructions_from_a_file(capsys: pytest.CaptureFixture, served: list,
                                  tmp_path: Path) -> None:
    (tmp_path / "instructions.md").write_text("Answer in English.\nQuote order ids.\n")
    code, _, _ = run(capsys, "serve", FLOWS, "--tools", TOOLS, "--instructions-file",
                     str(tmp_path / "instructions.md"))
    assert code == 0
    assert served[0][0].fastmcp.instructions == "Answer in English.\nQuote order ids."


HTTP_ONLY = [["--host", "127.0.0.1"], ["--port", "8000"], ["--stateless"],
             ["--allowed-host", "mcp.example.com"], ["--allowed-origin", "https://a.example"],
             ["--auth-token-file", "tokens.txt"]]


@pytest.mark.parametrize("command", ["serve", "inspect"])
@pytest.mark.parametrize("flag", HTTP_ONLY, ids=[f[0] for f in HTTP_ONLY])
def test_http_options_with_stdio_are_a_usage_error(
    capsys: pytest.CaptureFixture, served: list, command: str, flag: list[str],
) -> None:
    code, out, err = run(capsys, command, FLOWS, "--tools", TOOLS, *flag)
    assert (code, out, served) == (2, "", [])
    assert err == (f"chainweaver: error: {flag[0]} only applies to --transport "
                   "streamable-http, not stdio\n")


def test_instructions_come_from_one_place(capsys: pytest.CaptureFixture, served: list) -> None:
    code, out, err = run(capsys, "serve", FLOWS, "--tools", TOOLS, "--instructions", "x",
                         "--instructions-file", "instructions.md")
    assert (code, out, served) == (2, "", [])
    assert err == ("chainweaver: error: --instructions and --instructions-file cannot be "
                   "used together\n")


def test_several_http_options_with_stdio_are_named_together(
        capsys: pytest.CaptureFixture, served: list) -> None:
    code, _, err = run(capsys, "serve", FLOWS, "--tools", TOOLS, "--transport", "stdio",
                       "--port", "9000", "--stateless")
    assert code == 2
    assert err == ("chainweaver: error: --port, --stateless only apply to --transport "
                   "streamable-http, not stdio\n")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--flow-timeout", "0"], "'0' is not a number of seconds > 0"),
    (["--flow-timeout", "inf"], "'inf' is not a number of seconds > 0"),
    (["--page-size", "-1"], "'-1' is not a whole number > 0"),
    (["--error-detail", "verbose"], "invalid choice: 'verbose'"),
    (["--transport", "streamable-http", "--allowed-host", "http://evil.example.com"],
     "'http://evil.example.com' is not a valid value"),
    (["--transport", "streamable-http", "--allowed-origin", "app.example.com"],
     "'app.example.com' is not a valid value"),
])
def test_malformed_setting_values_are_usage_errors(
    capsys: pytest.CaptureFixture, argv: list[str], expected: str,
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", FLOWS, "--tools", TOOLS, *argv])
    assert exited.value.code == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(("host", "with_token", "warned"), [
    ("0.0.0.0", False, True), ("192.0.2.10", False, True), ("::", False, True),
    ("0.0.0.0", True, False), ("127.0.0.1", False, False), ("localhost", False, False),
    ("::1", False, False),
])
def test_a_non_loopback_bind_without_authentication_warns(
    capsys: pytest.CaptureFixture, served: list, tmp_path: Path, host: str,
    with_token: bool, warned: bool,
) -> None:
    auth = ["--auth-token-file", str(_token_file(tmp_path, "tok-1"))] if with_token else []
    code, _, err = run(capsys, "serve", FLOWS, "--tools", TOOLS, "--transport",
                       "streamable-http", "--host", host, *auth)
    assert code == 0 and len(served) == 1
    warnings = [line for line in err.splitlines() if line.startswith("chainweaver: warning:")]
    expected = [f"chainweaver: warning: {host} is not a loopback address and no "
                "--auth-token-file, --auth-jwks-uri or --auth-public-key is set: anyone who "
                "can reach port 8000 can call the published flows"]
    assert warnings == (expected if warned else [])


def test_a_token_file_readable_by_others_warns(capsys: pytest.CaptureFixture, served: list,
                                               tmp_path: Path) -> None:
    tokens = _token_file(tmp_path, "tok-1", mode=0o644)
    code, _, err = run(capsys, "serve", FLOWS, "--tools", TOOLS, "--transport",
                       "streamable-http", "--auth-token-file", str(tokens))
    assert code == 0
    assert err.splitlines()[-1] == (f"chainweaver: warning: --auth-token-file {tokens} is "
                                    f"readable by other users (chmod 600 {tokens})")


# ------------------------------------------------------------------ bad input


@pytest.fixture
def bad_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))  # for the dotted module acme_broken.tools
    def flow(name: str, body: str) -> None:
        (tmp_path / name).write_text(body)

    ok = "name: ping\ndescription: Ping.\nsteps: [find_order]\n"
    flow("syntax.flow.yaml", "name: ping\nsteps: [find_order\n")
    flow("syntax.flow.json", '{"name": "ping",}')
    flow("unknown.flow.yaml", ok + "stpes: []\n")
    flow("types.flow.yaml", ok + "version: 1.10\n")
    flow("model.flow.yaml", ok + "input_schema: flow_tools:Nope\n")
    flow("tool.flow.yaml", "name: ping\ndescription: Ping.\nsteps: [find_ordr]\n")
    flow("name.flow.yaml", "name: bad name\ndescription: Ping.\nsteps: [find_order]\n")
    (tmp_path / "dupes").mkdir()
    flow("dupes/a.flow.yaml", ok)
    flow("dupes/b.flow.json", '{"name": "ping", "description": "P", "steps": ["find_order"]}')
    (tmp_path / "empty").mkdir()
    flow("raises.py", "import os\nraise RuntimeError('tools module is broken')\n")
    flow("bad_syntax.py", "from chainweaver import tool\n\ndef lookup(order_id:\n")
    flow("uses_broken.py", "import os\nimport broken_helper\n")
    flow("broken_helper.py", "import os\n\n\nraise ValueError('WAREHOUSE_URL is not set')\n")
    flow("exits.py", "import sys\n\nsys.exit(4)\n")
    flow("empty_tokens.txt", "# no tokens yet\n\n")
    flow("bad_tokens.txt", "# dev tokens\ntok-ok-1\ntok with spaces\n")
    flow("empty_instructions.txt", "\n  \n")
    flow("needs_dep.py", "import not_installed_dependency_xyz\n")
    flow("no_tools.py", "VALUE = 1\n")
    flow("json.py", "VALUE = 1\n")  # named like a module that is already imported
    (tmp_path / "acme_broken").mkdir()
    flow("acme_broken/__init__.py", "")
    flow("acme_broken/tools.py", "import not_installed_dependency_xyz\n")
    flow("clash.py", "from chainweaver import tool\n\n@tool\ndef find_order(x: int) -> dict:\n"
                     "    return {}\n")
    return tmp_path


# (argv with {d} for the bad-input directory, exit code, message after "chainweaver: error: ")
BAD_RUNS = [
    (["{d}/missing.flow.yaml"], 2, "{d}/missing.flow.yaml: no such file or directory"),
    (["{d}/empty"], 2, "{d}/empty: no *.flow.yaml, *.flow.yml or *.flow.json files"),
    ([FLOWS, "--tools", "no_such_tools_module"], 2,
     "--tools no_such_tools_module: no module named 'no_such_tools_module'"),
    ([FLOWS, "--tools", "{d}/missing_tools.py"], 2, "--tools {d}/missing_tools.py: no such file"),
    ([FLOWS, "--tools", "{d}/raises.py"], 2, "--tools {d}/raises.py: importing it failed at "
     "{d}/raises.py:2: RuntimeError: tools module is broken"),
    ([FLOWS, "--tools", "{d}/needs_dep.py"], 2, "--tools {d}/needs_dep.py: importing it failed "
     "at {d}/needs_dep.py:1: ModuleNotFoundError: No module named 'not_installed_dependency_xyz'"),
    ([FLOWS, "--tools", "{d}/bad_syntax.py"], 2, "--tools {d}/bad_syntax.py: importing it "
     "failed at {d}/bad_syntax.py:3: SyntaxError: "),
    ([FLOWS, "--tools", "{d}/uses_broken.py"], 2, "--tools {d}/uses_broken.py: importing it "
     "failed at {d}/uses_broken.py:2 (raised at {d}/broken_helper.py:4): ValueError: "
     "WAREHOUSE_URL is not set"),
    ([FLOWS, "--tools", "{d}/exits.py"], 2,
     "--tools {d}/exits.py: importing it failed at {d}/exits.py:3: SystemExit: 4"),
    ([FLOWS, "--tools", "{d}/json.py"], 2, "--tools {d}/json.py: a different module named "
     "'json' is already imported; rename the file"),
    ([FLOWS, "--tools", "acme_broken.tools"], 2, "--tools acme_broken.tools: importing it "
     "failed at {d}/acme_broken/tools.py:1: ModuleNotFoundError: No module named "
     "'not_installed_dependency_xyz'"),
    ([FLOWS, "--tools", "{d}/no_tools.py"], 2,
     "--tools {d}/no_tools.py: the module defines no chainweaver Tool objects"),
    ([FLOWS, "--tools", "{d}/clash.py"], 1, "--tools {d}/clash.py: a different tool named "
     "'find_order' already came from examples/flow_tools.py"),
    (["{d}/syntax.flow.yaml"], 1,
     "{d}/syntax.flow.yaml: invalid YAML at line 3, column 1: expected ',' or ']'"),
    (["{d}/syntax.flow.json"], 1,
     "{d}/syntax.flow.json: invalid JSON at line 1, column 17: Expecting property name"),
    (["{d}/unknown.flow.yaml"], 1, "{d}/unknown.flow.yaml: stpes: unknown key (did you mean "
     "'steps'?"),
    (["{d}/types.flow.yaml"], 1,
     "{d}/types.flow.yaml: version: must be a string (quote it), got a number (1.1)"),
    (["{d}/model.flow.yaml"], 1,
     "{d}/model.flow.yaml: input_schema: module 'flow_tools' has no attribute 'Nope'"),
    (["{d}/tool.flow.yaml"], 1, "{d}/tool.flow.yaml: steps[0].tool: no tool named 'find_ordr' "
     "is registered (did you mean 'find_order'?"),
    (["{d}/name.flow.yaml"], 1, "{d}/name.flow.yaml: name: flow name 'bad name' is invalid"),
    (["{d}/dupes"], 1, "{d}/dupes/b.flow.json: version: flow 'ping' version '1.0.0' is "
     "already defined in {d}/dupes/a.flow.yaml"),
    ([FLOWS, "--lifecycle", "live"], 1,
     "--lifecycle: 'live' is not one of draft, reviewed, active, archived"),
    ([FLOWS, "--side-effects", "none,risky"], 1,
     "--side-effects: 'risky' is not one of none, read, write, external, destructive"),
    ([FLOWS, "--owner", ","], 1, "--owner needs at least one value"),
    ([FLOWS, "--prefix", "bad prefix"], 1, "server_prefix 'bad prefix' is not a valid name part"),
    ([FLOWS, "--transport", "streamable-http", "--auth-token-file", "{d}/no_tokens.txt"], 2,
     "--auth-token-file {d}/no_tokens.txt: no such file"),
    ([FLOWS, "--transport", "streamable-http", "--auth-token-file", "{d}/empty_tokens.txt"], 1,
     "--auth-token-file {d}/empty_tokens.txt: the file lists no tokens"),
    ([FLOWS, "--transport", "streamable-http", "--auth-token-file", "{d}/bad_tokens.txt"], 1,
     "--auth-token-file {d}/bad_tokens.txt, line 3: not a bearer token"),
    ([FLOWS, "--instructions-file", "{d}/no_instructions.txt"], 2,
     "--instructions-file {d}/no_instructions.txt: no such file"),
    ([FLOWS, "--instructions-file", "{d}/empty_instructions.txt"], 1,
     "--instructions-file {d}/empty_instructions.txt: the file is empty"),
]


def _fill(value: str, directory: Path) -> str:
    return value.replace("{d}", str(directory))


@pytest.mark.parametrize("command", ["inspect", "serve"])
@pytest.mark.parametrize(("argv", "exit_code", "message"), BAD_RUNS,
                         ids=[f"{case[1]}-{case[2][:40]}" for case in BAD_RUNS])
def test_bad_input_fails_with_one_line_and_the_right_exit_code(
    capsys: pytest.CaptureFixture, bad_inputs: Path, served: list, command: str,
    argv: list[str], exit_code: int, message: str,
) -> None:
    args = [_fill(a, bad_inputs) for a in argv]
    if "--tools" not in args:
        args += ["--tools", TOOLS]
    elif args[args.index("--tools") + 1] != TOOLS:
        args = [*args[:args.index("--tools")], "--tools", TOOLS,
                *args[args.index("--tools"):]]
    code, out, err = run(capsys, command, *args)
    assert code == exit_code
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("chainweaver: error: " + _fill(message, bad_inputs))
    assert served == []  # nothing was served


def test_yaml_files_without_pyyaml_exit_2_with_the_install_hint(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)
    code, out, err = run(capsys, "inspect", FLOWS, "--tools", TOOLS)
    assert (code, out) == (2, "")
    assert err == ("chainweaver: error: YAML flow files need PyYAML: pip install -e "
                   "'.[yaml]' in a clone of ChainWeaver (JSON flow files work without it)\n")
    # JSON flow files still load.
    code, out, _ = run(capsys, "inspect", f"{FLOWS}/help_search.flow.json", "--tools", TOOLS)
    assert code == 0 and "help_search" in out


@pytest.mark.parametrize(("argv", "expected"), [
    (["inspect", FLOWS], "the following arguments are required: --tools"),
    (["serve", FLOWS, "--tools", TOOLS, "--transport", "sse"], "invalid choice: 'sse'"),
    (["serve", FLOWS, "--tools", TOOLS, "--port", "http"],
     "'http' is not a port number (1-65535)"),
    (["serve", FLOWS, "--tools", TOOLS, "--port", "70000"],
     "'70000' is not a port number (1-65535)"),
    (["inspect", FLOWS, "--tools", TOOLS, "--port", "0"], "'0' is not a port number"),
    (["inspect", "--tools", TOOLS], "the following arguments are required: PATH"),
])
def test_malformed_command_lines_are_usage_errors(
    capsys: pytest.CaptureFixture, argv: list[str], expected: str,
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert expected in capsys.readouterr().err


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys)
    assert (code, out) == (2, "")
    assert "serve" in err and "inspect" in err


# ------------------------------------------------------------------ real processes


def _serve_args(*extra: str) -> list[str]:
    return ["serve", FLOWS, "--tools", TOOLS, "--expose-schemas", "--expose-prompts", *extra]


async def _published(client: Client) -> tuple[list[str], list[str], list[str]]:
    tools = sorted(t.name for t in await client.list_tools())
    resources = sorted(str(r.uri) for r in await client.list_resources())
    prompts = sorted(p.name for p in await client.list_prompts())
    return tools, resources, prompts


@pytest.mark.anyio
async def test_serve_over_stdio_answers_a_real_client(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    transport = StdioTransport(CHAINWEAVER, _serve_args(), cwd=str(ROOT), keep_alive=False,
                               log_file=log)
    async with Client(transport) as client:
        assert await _published(client) == (EXPOSED, RESOURCES, sorted(PROMPTS))
        result = await client.call_tool("order_total", {"order_id": "A-1003",
                                                        "to_currency": "USD"})
        assert result.structured_content == {"order_id": "A-1003", "converted_cents": 11308,
                                             "to_currency": "USD"}
        hidden = await client.call_tool("refund_order", {"order_id": "A-1001",
                                                         "reason": "broken"},
                                        raise_on_error=False)
        assert hidden.is_error and hidden.content[0].text == "Unknown tool: 'refund_order'"
    stderr = log.read_text()
    assert "chainweaver: exposed 3 of 6 flows: help_search, order_status, order_total" in stderr
    assert "chainweaver: serving 3 tool(s), 4 resource(s), 5 prompt(s) on stdio" in stderr


def _rpc(message_id: int, method: str, params: dict) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": message_id, "method": method,
                       "params": params}) + "\n"


def test_python_dash_m_under_stdio_writes_nothing_but_mcp_to_stdout() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "chainweaver", *_serve_args()], cwd=ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(STARTUP_TIMEOUT, process.kill)  # never hang on readline
    watchdog.start()
    try:
        requests = [
            _rpc(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                   "clientInfo": {"name": "raw", "version": "0"}}),
            json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n",
            _rpc(2, "tools/list", {}), _rpc(3, "prompts/list", {}),
            _rpc(4, "resources/list", {}),
        ]
        lines = []
        for request in requests:
            process.stdin.write(request)
            process.stdin.flush()
            if '"id"' in request:
                lines.append(process.stdout.readline())
        rest, stderr = process.communicate(timeout=EXIT_TIMEOUT)  # closes stdin: shutdown
    finally:
        watchdog.cancel()
        stop(process)
    lines += rest.splitlines(keepends=True)
    messages = [json.loads(line) for line in lines]
    assert all(m["jsonrpc"] == "2.0" for m in messages)
    by_id = {m["id"]: m["result"] for m in messages}
    assert sorted(t["name"] for t in by_id[2]["tools"]) == EXPOSED
    assert sorted(p["name"] for p in by_id[3]["prompts"]) == sorted(PROMPTS)
    assert sorted(r["uri"] for r in by_id[4]["resources"]) == RESOURCES
    assert process.returncode == 0
    assert "chainweaver: loaded 6 flow file(s) and 8 tool(s)" in stderr


@pytest.mark.anyio
async def test_serve_over_streamable_http_answers_a_real_client(tmp_path: Path) -> None:
    port = free_port()
    with open(tmp_path / "server.log", "w") as output:
        process = subprocess.Popen(
            [CHAINWEAVER, *_serve_args("--transport", "streamable-http", "--port", str(port),
                                       "--prefix", "shop", "--lifecycle", "active,draft")],
            cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(StreamableHttpTransport(url)) as client:
                tools, resources, prompts = await _published(client)
                result = await client.call_tool("shop__help_search", {"query": "parcel"})
                assert result.structured_content["article_ids"] == ["kb-12"]
        finally:
            stop(process)
    names = ["churn_risk", *EXPOSED]
    assert tools == [f"shop__{n}" for n in names]
    assert resources == ["chainweaver://flows"] + [
        f"chainweaver://flows/shop__{n}/schema" for n in names]
    assert prompts == sorted(["chainweaver_guide", *(f"shop__{n}" for n in names),
                              "shop__order_status__customer_reply"])
    log = (tmp_path / "server.log").read_text()
    assert f"on http://127.0.0.1:{port}/mcp" in log


def test_a_bad_file_never_starts_a_server(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    shutil.copytree(ROOT / FLOWS, flows)
    (flows / "broken.flow.yaml").write_text("name: broken\ndescription: B\nsteps: [nope]\n")
    completed = subprocess.run(
        [CHAINWEAVER, "serve", str(flows), "--tools", TOOLS], cwd=ROOT, input="",
        capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
    assert completed.returncode == 1
    assert completed.stdout == ""
    assert completed.stderr.startswith(f"chainweaver: error: {flows}/broken.flow.yaml: "
                                       "steps[0].tool: no tool named 'nope'")
    assert completed.stderr.count("\n") == 1


def test_without_the_mcp_extra_the_cli_exits_2_and_says_what_to_install() -> None:
    script = textwrap.dedent("""
        import sys

        class BlockMcp:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("fastmcp", "mcp", "jsonschema"):
                    raise ImportError(f"blocked for this test: {name}")

        sys.meta_path.insert(0, BlockMcp())
        from chainweaver.cli import main
        raise SystemExit(main(sys.argv[1:]))
    """)
    completed = subprocess.run(
        [sys.executable, "-c", script, "inspect", FLOWS, "--tools", TOOLS], cwd=ROOT,
        capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
    assert completed.returncode == 2
    assert completed.stderr == ("chainweaver: error: chainweaver inspect needs the mcp extra: "
                                "pip install -e '.[mcp]' in a clone of ChainWeaver\n")


def test_console_script_and_python_dash_m_are_the_same_command() -> None:
    outputs = [subprocess.run(command + ["--version"], capture_output=True, text=True,
                              timeout=STARTUP_TIMEOUT)
               for command in ([CHAINWEAVER], [sys.executable, "-m", "chainweaver"])]
    assert outputs[0].stdout == outputs[1].stdout
    assert outputs[0].stdout.startswith(f"chainweaver {__version__}\nfastmcp ")
    inspected = [subprocess.run(command + ["inspect", FLOWS, "--tools", TOOLS, "--json"],
                                cwd=ROOT, capture_output=True, text=True,
                                timeout=STARTUP_TIMEOUT)
                 for command in ([CHAINWEAVER], [sys.executable, "-m", "chainweaver"])]
    assert inspected[0].returncode == inspected[1].returncode == 0
    assert json.loads(inspected[0].stdout) == json.loads(inspected[1].stdout)
    assert json.loads(inspected[0].stdout)["tools"] == EXPOSED


def test_serve_on_a_port_in_use_exits_3_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run_serve = subprocess.run(
            [CHAINWEAVER, *_serve_args("--transport", "streamable-http", "--port", str(port))],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run_serve.returncode == 3
    assert (f"chainweaver: error: the server could not start on 127.0.0.1:{port} "
            "(see the log above)") in run_serve.stderr
    assert "address already in use" in run_serve.stderr
    assert "Traceback" not in run_serve.stderr


@pytest.mark.anyio
async def test_a_token_file_makes_http_require_a_bearer_token(tmp_path: Path) -> None:
    import httpx2

    tokens = _token_file(tmp_path, "tok-alice-4f1c", "tok-bob-9b2e")
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with open(tmp_path / "server.log", "w") as output:
        process = subprocess.Popen(
            [CHAINWEAVER, *_serve_args("--transport", "streamable-http", "--port", str(port),
                                       "--auth-token-file", str(tokens))],
            cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            initialize = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                     "params": {"protocolVersion": "2025-11-25",
                                                "capabilities": {},
                                                "clientInfo": {"name": "t", "version": "0"}}})
            refused = {}
            for label, header in [("none", None), ("wrong", "Bearer tok-mallory"),
                                  ("scheme", "Basic tok-alice-4f1c"),
                                  ("prefix", "Bearer tok-alice-4f1")]:
                headers = {"Content-Type": "application/json",
                           "Accept": "application/json, text/event-stream"}
                if header:
                    headers["Authorization"] = header
                response = httpx2.post(url, content=initialize, headers=headers,
                                       timeout=STARTUP_TIMEOUT)
                refused[label] = (response.status_code,
                                  response.headers.get("www-authenticate", "").split(" ")[0])
            transport = StreamableHttpTransport(
                url, headers={"Authorization": "Bearer tok-bob-9b2e"})
            async with Client(transport) as client:
                tools, _, _ = await _published(client)
        finally:
            stop(process)
    assert refused == dict.fromkeys(["none", "wrong", "scheme", "prefix"], (401, "Bearer"))
    assert tools == EXPOSED
    log = (tmp_path / "server.log").read_text()
    assert "tok-alice-4f1c" not in log and "tok-bob-9b2e" not in log
    assert "warning" not in log


def _into_closed_pipe(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader is already gone, as `... | head -0` would."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(argv, cwd=ROOT, stdout=writer, stderr=subprocess.PIPE,
                              input=stdin, text=True, timeout=STARTUP_TIMEOUT)
    finally:
        os.close(writer)


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_inspect_into_a_closed_pipe_exits_141_quietly(extra: list[str]) -> None:
    completed = _into_closed_pipe([CHAINWEAVER, "inspect", FLOWS, "--tools", TOOLS, *extra])
    assert (completed.returncode, completed.stderr) == (141, "")


def test_serve_over_stdio_into_a_closed_pipe_exits_141_quietly() -> None:
    request = _rpc(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                     "clientInfo": {"name": "raw", "version": "0"}})
    completed = _into_closed_pipe([CHAINWEAVER, *_serve_args()], stdin=request)
    assert completed.returncode == 141
    assert "chainweaver: serving 3 tool(s)" in completed.stderr  # it did start
    assert "Traceback" not in completed.stderr and "Error" not in completed.stderr


def test_a_broken_tools_module_is_reported_by_file_and_line_without_a_traceback(
        tmp_path: Path) -> None:
    (tmp_path / "half_done.py").write_text("from chainweaver import tool\n\n\n@tool(\n")
    completed = subprocess.run(
        [CHAINWEAVER, "serve", FLOWS, "--tools", str(tmp_path / "half_done.py")], cwd=ROOT,
        input="", capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
    assert (completed.returncode, completed.stdout) == (2, "")
    assert completed.stderr == (f"chainweaver: error: --tools {tmp_path}/half_done.py: "
                                f"importing it failed at {tmp_path}/half_done.py:4: "
                                "SyntaxError: '(' was never closed\n")


def test_the_command_table_of_the_docs_lists_every_command() -> None:
    import argparse

    from chainweaver.cli.commands import build_parser

    [commands] = [action for action in build_parser()._actions
                  if isinstance(action, argparse._SubParsersAction)]
    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    table = page[page.index("| command | what it does |"):page.index("## See what")]
    listed = {line.split("`chainweaver ", 1)[1].split()[0].rstrip("`")
              for line in table.splitlines() if line.startswith("| `chainweaver ")}
    assert listed == set(commands.choices)
