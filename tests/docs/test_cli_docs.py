"""docs/cli.md and docs/flow-files.md stay true: every command they show is run.

- ```console blocks: each `$ command` runs in bash (from a directory where `examples/`
  is the repository's and the doc's own example files exist) and must print exactly
  the lines shown after it.
- ```bash blocks: each is a `serve` command; it is started for real (stdio, or HTTP on
  a free port) and a real MCP client must list exactly what `inspect --json` with the
  same options says. A ```text block of `chainweaver:` lines after one is its stderr.
- ```json client configurations are started the way a client would, from elsewhere.
- ```yaml/```json flow files are the files in examples/flows/, or are written out for
  the console examples; the ```python example runs; the error table is reproduced.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from support.procs import STARTUP_TIMEOUT, free_port, stop, wait_until_listening

from chainweaver import FlowFileError, Tool, load_flows

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = ["cli.md", "flow-files.md"]
BIN = Path(sys.executable).parent
CHAINWEAVER = str(BIN / "chainweaver")
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def blocks(page: str) -> list[tuple[str, str]]:
    """(language, content) of every fenced block, in order."""
    return re.findall(r"```(\w+)\n(.*?)```", (DOCS / page).read_text(), re.DOTALL)


def console_examples() -> list[tuple[str, str, str]]:
    cases = []
    for page in PAGES:
        for language, content in blocks(page):
            if language != "console":
                continue
            for chunk in re.split(r"^\$ ", content, flags=re.MULTILINE)[1:]:
                command, _, output = chunk.partition("\n")
                cases.append((page, command, output))
    return cases


def serve_examples() -> list[tuple[str, str, str | None]]:
    """(page, serve command, the summary block shown after it or None)."""
    cases: list[tuple[str, str, str | None]] = []
    for page in PAGES:
        for language, content in blocks(page):
            if language == "bash":
                for line in content.strip().splitlines():
                    assert " serve " in f" {line} ", f"{page}: a command never run: {line}"
                    cases.append((page, line, None))
            elif language == "text" and content.startswith("chainweaver: ") and cases:
                cases[-1] = (*cases[-1][:2], content)
    return cases


def named_flow_files() -> dict[str, str]:
    """The doc's YAML blocks that start with `# file name`, by name."""
    files = {}
    for language, content in blocks("flow-files.md"):
        first, _, rest = content.partition("\n")
        if language == "yaml" and first.startswith("# "):
            files[first[2:]] = rest
    return files


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory where `examples/` is the repository's and the doc's files exist."""
    directory = tmp_path_factory.mktemp("docs-cli")
    (directory / "examples").symlink_to(ROOT / "examples")
    for name, text in named_flow_files().items():
        if not name.startswith("examples/"):
            (directory / name).write_text(text)
    return directory


def command_argv(command: str) -> list[str]:
    argv = shlex.split(command)
    program = {"chainweaver": [CHAINWEAVER], "python": [sys.executable]}[argv[0]]
    return program + argv[1:]


def inspect_json(argv: list[str], cwd: Path) -> dict[str, Any]:
    """What `inspect --json` says the same options publish."""
    position = argv.index("serve")
    inspect = [*argv[:position], "inspect", *argv[position + 1:], "--json"]
    completed = subprocess.run(inspect, cwd=cwd, env=ENV, capture_output=True, text=True,
                               timeout=STARTUP_TIMEOUT)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


async def listed(client: Client) -> dict[str, list[str]]:
    return {
        "tools": sorted(t.name for t in await client.list_tools()),
        "resources": sorted(str(r.uri) for r in await client.list_resources()),
        "prompts": sorted(p.name for p in await client.list_prompts()),
    }


async def served_over_stdio(argv: list[str], cwd: Path, log: Path) -> dict[str, list[str]]:
    transport = StdioTransport(argv[0], argv[1:], cwd=str(cwd), keep_alive=False, log_file=log)
    async with Client(transport) as client:
        return await listed(client)


def bearer_headers(argv: list[str], cwd: Path) -> dict[str, str]:
    """The Authorization header a client of this command needs: the first token of its
    --auth-token-file (written, as the docs show, when an earlier example did not)."""
    if "--auth-token-file" not in argv:
        return {}
    path = cwd / argv[argv.index("--auth-token-file") + 1]
    if not path.exists():
        path.write_text(secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)
    tokens = [line.strip() for line in path.read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    return {"Authorization": f"Bearer {tokens[0]}"}


async def served_over_http(argv: list[str], cwd: Path, log: Path) -> dict[str, list[str]]:
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)  # the docs say 8000; tests take a free port
    headers = bearer_headers(argv, cwd)
    with open(log, "w") as output:
        process = subprocess.Popen(argv, cwd=cwd, env=ENV, stdout=output,
                                   stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            url = f"http://127.0.0.1:{port}/mcp"
            if headers:  # without the token the server must refuse
                refused = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                      timeout=STARTUP_TIMEOUT)
                assert refused.status_code == 401
                assert refused.headers["www-authenticate"].startswith("Bearer")
            async with Client(StreamableHttpTransport(url, headers=headers)) as client:
                return await listed(client)
        finally:
            stop(process)


def expected_lists(report: dict[str, Any]) -> dict[str, list[str]]:
    return {key: sorted(report[key]) for key in ("tools", "resources", "prompts")}


# ------------------------------------------------------------------ commands


@pytest.mark.parametrize(("page", "command", "output"), console_examples(),
                         ids=[f"{p}: {c[:60]}" for p, c, _ in console_examples()])
def test_console_examples_print_what_the_docs_show(sandbox: Path, page: str, command: str,
                                                   output: str) -> None:
    completed = subprocess.run(["bash", "-c", command], cwd=sandbox, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=STARTUP_TIMEOUT)
    assert completed.returncode == 0
    assert completed.stdout.rstrip("\n") == output.rstrip("\n")


@pytest.mark.anyio
@pytest.mark.parametrize(("page", "command", "summary"), serve_examples(),
                         ids=[c[:70] for _, c, _ in serve_examples()])
async def test_serve_examples_publish_what_inspect_says(
    sandbox: Path, tmp_path: Path, page: str, command: str, summary: str | None,
) -> None:
    argv = command_argv(command)
    log = tmp_path / "server.log"
    if "streamable-http" in argv:
        published = await served_over_http(argv, sandbox, log)
    else:
        published = await served_over_stdio(argv, sandbox, log)
    assert published["tools"]
    assert published == expected_lists(inspect_json(argv, sandbox))
    if summary is not None:
        printed = [line for line in log.read_text().splitlines()
                   if line.startswith("chainweaver: ")]
        assert printed == summary.strip().splitlines()


def client_configs() -> list[dict[str, Any]]:
    return [json.loads(content) for language, content in blocks("cli.md")
            if language == "json"]


def _local(value: str) -> str:
    for placeholder in ("/path/to/chainweaver/.venv/bin/chainweaver",
                        "${workspaceFolder}/.venv/bin/chainweaver"):
        value = value.replace(placeholder, CHAINWEAVER)
    return value.replace("/path/to/chainweaver", str(ROOT)).replace("${workspaceFolder}",
                                                                    str(ROOT))


@pytest.mark.anyio
@pytest.mark.parametrize("index", range(2))
async def test_stdio_client_configurations_work_from_any_directory(
    tmp_path: Path, index: int,
) -> None:
    stdio = [entry for config in client_configs()
             for entry in (config.get("mcpServers") or config["servers"]).values()
             if "command" in entry]
    assert len(stdio) == 2  # Claude Desktop style and VS Code
    entry = stdio[index]
    argv = [_local(entry["command"]), *(_local(arg) for arg in entry["args"])]
    elsewhere = tmp_path / "client-cwd"
    elsewhere.mkdir()
    published = await served_over_stdio(argv, elsewhere, tmp_path / "server.log")
    assert published == expected_lists(inspect_json(argv, elsewhere))
    assert published["tools"] == ["help_search", "order_status", "order_total"]


def test_http_client_configuration_points_at_the_documented_server() -> None:
    (http,) = [entry for config in client_configs()
               for entry in (config.get("mcpServers") or config["servers"]).values()
               if entry.get("type") == "http"]
    commands = [c for _, c, _ in serve_examples() if "streamable-http" in c]
    assert commands
    for command in commands:
        argv = shlex.split(command)
        host, port = argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]
        assert http["url"] == f"http://{host}:{port}/mcp"


# ------------------------------------------------------------------ flow files


def test_yaml_examples_are_the_example_files_or_used_by_a_command() -> None:
    commands = " ".join(c for _, c, _ in console_examples())
    for name, text in named_flow_files().items():
        if name.startswith("examples/"):
            assert (ROOT / name).read_text() == text, name
        else:
            assert name in commands, f"{name} is shown but never used"


def test_json_example_is_the_example_file() -> None:
    (document,) = [json.loads(content) for language, content in blocks("flow-files.md")
                   if language == "json"]
    path = ROOT / "examples" / "flows" / f"{document['name']}.flow.json"
    assert json.loads(path.read_text()) == document


def test_python_example_runs_and_prints_what_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (code,) = [content for language, content in blocks("flow-files.md") if language == "python"]
    printed = io.StringIO()
    with redirect_stdout(printed):
        exec(compile(code, "docs/flow-files.md", "exec", dont_inherit=True),
             {"__name__": "docs_flow_files"})
    comment = re.search(r"print\(.*\)\s+# (.*)", code).group(1)
    assert printed.getvalue().strip() == comment


# One file per row of the error table in flow-files.md, by the problem column.
TABLE_CASES = {
    "YAML or JSON syntax": {"x.flow.yaml": "name: ping\nsteps: [find_order\n"},
    "duplicate key": {"x.flow.yaml": "name: ping\ndescription: P.\nsteps: [a]\nname: pong\n"},
    "unknown key": {"x.flow.yaml": "name: ping\ndescription: P.\nsteps: [a]\nstpes: []\n"},
    "missing key": {"x.flow.yaml": "name: ping\ndescription: P.\n"},
    "wrong type": {"x.flow.yaml": "name: ping\ndescription: P.\n"
                                  "steps: [{tool: find_order, input_mapping: [a]}]\n"},
    "bad value": {"x.flow.yaml": "name: ping\ndescription: P.\nsteps: [find_order]\n"
                                 "governance: {lifecycle: live}\n"},
    "bad name or version": {"x.flow.yaml": "name: order status\ndescription: P.\n"
                                           "steps: [find_order]\n"},
    "bad model reference": {"x.flow.yaml": "name: ping\ndescription: P.\nsteps: [find_order]\n"
                                           "input_schema: flow_tools:OrderQry\n"},
    "bad inline schema": {"x.flow.yaml": "name: ping\ndescription: P.\nsteps: [find_order]\n"
                          "input_schema: {type: object, properties: "
                          "{limit: {type: integer, default: ten}}}\n"},
    "bad prompt": {"x.flow.yaml": "name: ping\ndescription: P.\nsteps: [find_order]\n"
                   "prompts: [{name: ask, messages: [{role: user, text: 'Hi {{ who }}'}]}]\n"},
    "missing tool or field": {"x.flow.yaml": "name: ping\ndescription: P.\nsteps: "
                              "[find_order, {tool: convert_price, input_mapping: "
                              "{amount: total_cents}}]\n"},
    "duplicate flow": {"flows/a.flow.yaml": "name: ping\ndescription: P.\nsteps: [find_order]\n",
                       "flows/b.flow.json": '{"name": "ping", "description": "P.", '
                                            '"steps": ["find_order"]}'},
}


def error_table() -> dict[str, str]:
    text = (DOCS / "flow-files.md").read_text().split("The other messages you can meet:")[1]
    rows = re.findall(r"^\| ([^|`]+?) \| `(.+)` \|$", text, re.MULTILINE)
    return {problem: message for problem, message in rows}


def test_the_error_table_shows_real_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             ) -> None:
    table = error_table()
    assert sorted(table) == sorted(TABLE_CASES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import flow_tools

    tools = {v.name: v for v in vars(flow_tools).values() if isinstance(v, Tool)}
    for problem, files in TABLE_CASES.items():
        case = tmp_path / problem.replace(" ", "_")
        for name, text in files.items():
            (case / name).parent.mkdir(parents=True, exist_ok=True)
            (case / name).write_text(text)
        monkeypatch.chdir(case)
        with pytest.raises(FlowFileError) as raised:
            load_flows(next(iter(files)).split("/")[0], tools=tools)
        message = str(raised.value).split(": ", 1)[1]
        pattern = re.escape(table[problem]).replace(re.escape("..."), ".*")
        assert re.fullmatch(pattern, message), (problem, message)


def test_the_missing_pyyaml_message_is_the_real_one(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)
    path = tmp_path / "a.flow.yaml"
    path.write_text("name: a\n")
    with pytest.raises(ModuleNotFoundError) as raised:
        load_flows(path)
    documented = " ".join((DOCS / "flow-files.md").read_text().split())
    assert f"`{raised.value}`" in documented
