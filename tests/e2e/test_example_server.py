"""examples/mcp_flow_server.py: the README's main job, in every mode it documents.

``--demo`` is run exactly as the README runs it; the stdio and HTTP modes and
``fastmcp run`` are served in real subprocesses and answered to a real MCP client.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from support.procs import EXIT_TIMEOUT, free_port, stop, wait_until_listening

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mcp_flow_server.py"
EXPOSED_TOOLS = ["book_card", "book_price", "book_search"]
EXCLUDED = {"similar_books": "lifecycle 'draft'", "reserve_book": "side effects 'write'",
            "legacy_stock": "effective safety is unknown"}
EXPECTED_PROMPTS = ["book_card", "book_price", "book_search", "book_search__gift_ideas",
                    "chainweaver_guide"]
EXPECTED_RESOURCES = ["chainweaver://flows"] + [
    f"chainweaver://flows/{name}/schema" for name in EXPOSED_TOOLS]


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mcp_flow_server_example", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # pydantic resolves the example's postponed annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def assert_catalogue(client: Client) -> None:
    """What any client of the example must see, whatever the transport."""
    assert sorted(t.name for t in await client.list_tools()) == EXPOSED_TOOLS
    assert sorted(str(r.uri) for r in await client.list_resources()) == EXPECTED_RESOURCES
    assert sorted(p.name for p in await client.list_prompts()) == EXPECTED_PROMPTS
    card = await client.call_tool("book_card", {"isbn": "978-0-14-143951-8"})
    assert card.structured_content == {
        "card": "Pride and Prejudice by Jane Austen, EUR 8.99, ships today", "available": True}


def test_demo_exits_zero_and_prints_every_section() -> None:
    run = subprocess.run([sys.executable, str(EXAMPLE), "--demo"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for title in ("1. Exposure report", "2. Tools", "3. Resources", "4. Prompts",
                  "5. Read one schema resource", "6. Render the invocation prompt",
                  "7. Call the tool with the prompt's arguments",
                  "8. An excluded flow answers like one that never existed"):
        assert f"== {title}" in out
    for name, reason in EXCLUDED.items():
        assert f"EXCLUDED  {name} 1.0.0: {reason}" in out
    # The report is printed once, by the demo: the exposure decision's own warnings
    # ("flow ... is not exposed") are not printed as well, on either stream.
    assert "is not exposed" not in out + run.stderr
    for name in EXCLUDED:
        assert out.count(f" {name} 1.0.0") == 1
    for uri in EXPECTED_RESOURCES:
        assert uri in out
    assert "template chainweaver://flows/{published_name}/schema" in out
    assert '<user-data name="arguments">' in out
    # The call made with the rendered prompt's arguments returned the flow's result, and
    # the log messages the server sent during it are the demo's own lines, in order,
    # between the call and its result (not FastMCP's rich-formatted client log).
    lines = out.splitlines()
    call = next(i for i, line in enumerate(lines)
                if line.startswith("  tools/call book_search {"))
    assert lines[call + 1:call + 6] == [
        *(f"  server log (info chainweaver): step '{step}' {event}"
          for step in ("find_books", "rank_by_rating") for event in ("started", "completed")),
        '  -> {"count": 2, "titles": ["The Guns of August", "Guns, Germs, and Steel"]}',
    ]
    assert "Received INFO from server" not in out + run.stderr
    assert "tools/call reserve_book: isError=True \"Unknown tool: 'reserve_book'\"" in out
    assert out.rstrip().endswith("Demo complete.")


def test_exposure_report_names_every_primitive_and_reason() -> None:
    server = load_example().build_server()
    report = {entry.flow_name: entry for entry in server.exposure_report()}
    assert sorted(name for name, e in report.items() if e.exposed) == EXPOSED_TOOLS
    for name, reason in EXCLUDED.items():
        assert not report[name].exposed
        assert reason in report[name].reason
        assert report[name].tool_name is None and not report[name].prompt_names
    search = report["book_search"]
    assert search.resource_uris == ("chainweaver://flows/book_search/schema",)
    assert search.prompt_names == ("book_search", "book_search__gift_ideas")


@pytest.mark.anyio
async def test_every_invocation_prompt_yields_arguments_the_tool_accepts() -> None:
    server = load_example().build_server()
    async with Client(server.fastmcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
        required = {"book_card": {"isbn": "978-0-06-112008-4"},
                    "book_price": {"isbn": "978-0-06-112008-4"},
                    "book_search": {"query": "austen"}}
        for name, arguments in required.items():
            rendered = await client.get_prompt(name, arguments)
            tool_arguments = rendered.meta["chainweaver"]["arguments"]
            jsonschema.validate(tool_arguments, tools[name].input_schema)
            result = await client.call_tool(name, tool_arguments)
            assert not result.is_error
        quote = await client.call_tool("book_price", {"isbn": "978-0-06-112008-4",
                                                      "currency": "GBP"})
        assert quote.structured_content == {"price": "GBP 9.34"}


@pytest.mark.anyio
async def test_stdio_mode_answers_a_real_client(tmp_path: Path) -> None:
    transport = StdioTransport(sys.executable, [str(EXAMPLE)], cwd=str(tmp_path),
                               keep_alive=False, log_file=tmp_path / "stderr.log")
    async with Client(transport) as client:
        await assert_catalogue(client)
        schema = await client.read_resource("chainweaver://flows/book_price/schema")
        assert json.loads(schema[0].text)["tool_name"] == "book_price"


@pytest.mark.anyio
async def test_streamable_http_mode_answers_a_real_client(tmp_path: Path) -> None:
    port = free_port()
    with open(tmp_path / "server.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--transport", "streamable-http",
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            wait_until_listening(process, port)
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(StreamableHttpTransport(url)) as client:
                await assert_catalogue(client)
        finally:
            stop(process)
    assert f"Serving on http://127.0.0.1:{port}/mcp" in (tmp_path / "server.log").read_text()


@pytest.mark.anyio
async def test_fastmcp_cli_finds_the_server(tmp_path: Path) -> None:
    fastmcp_cli = shutil.which("fastmcp", path=str(Path(sys.executable).parent))
    assert fastmcp_cli, "the mcp extra installs FastMCP's command line next to python"
    transport = StdioTransport(fastmcp_cli, ["run", str(EXAMPLE), "--no-banner"],
                               cwd=str(tmp_path), keep_alive=False,
                               log_file=tmp_path / "stderr.log")
    async with Client(transport) as client:
        await assert_catalogue(client)


def test_bad_command_line_is_a_usage_error() -> None:
    run = subprocess.run([sys.executable, str(EXAMPLE), "--transport", "carrier-pigeon"],
                         capture_output=True, text=True, timeout=EXIT_TIMEOUT)
    assert run.returncode == 2
    assert "invalid choice: 'carrier-pigeon'" in run.stderr


# ------------------------------------------------------- docs/getting-started.md

GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text()


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GETTING_STARTED, re.DOTALL)


def command_line(block: str) -> list[str]:
    """A documented command, with ``python``/``fastmcp`` bound to this environment."""
    words = shlex.split(block.strip())
    programs = {"python": sys.executable,
                "fastmcp": shutil.which("fastmcp", path=str(Path(sys.executable).parent))}
    return [programs[words[0]], *words[1:]]


@pytest.mark.anyio
async def test_getting_started_commands_all_run(tmp_path: Path) -> None:
    commands = [command_line(block) for block in doc_blocks("bash")]
    assert len(commands) == 4
    for command in commands:
        if "--demo" in command:
            run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stderr
            assert "Demo complete." in run.stdout
        elif "streamable-http" in command:
            port = free_port()  # the documented 8000 may be taken on a test machine
            command[command.index("--port") + 1] = str(port)
            process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            try:
                wait_until_listening(process, port)
                async with Client(StreamableHttpTransport(
                        f"http://127.0.0.1:{port}/mcp")) as client:
                    await assert_catalogue(client)
            finally:
                stop(process)
        else:
            transport = StdioTransport(command[0], command[1:], cwd=str(ROOT),
                                       keep_alive=False, log_file=tmp_path / "stderr.log")
            async with Client(transport) as client:
                await assert_catalogue(client)


def test_getting_started_python_runs(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict = {}
    for code in doc_blocks("python"):
        exec(compile(code, "getting-started.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "True {'text': 'Hello, Ada!'}" in out
    assert "['hello']" in out
