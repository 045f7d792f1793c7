"""docs/mcp-server.md stays true: its Python examples run and its JSON is valid."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import anyio
import pytest
from fastmcp import Client

DOC = Path(__file__).resolve().parents[2] / "docs" / "mcp-server.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)


def run_python_blocks() -> dict:
    namespace: dict = {}
    printed = io.StringIO()
    with redirect_stdout(printed):
        for code in blocks("python"):
            exec(compile(code, str(DOC), "exec", dont_inherit=True), namespace)
    namespace["printed"] = printed.getvalue()
    return namespace


def test_json_blocks_parse() -> None:
    documents = [json.loads(text) for text in blocks("json")]
    assert any("mcpServers" in d for d in documents)
    assert any(d.get("servers", {}).get("chainweaver", {}).get("type") == "http"
               for d in documents)


@pytest.mark.anyio
async def test_python_examples_run_and_behave_as_described() -> None:
    # In a worker thread: a block may run its own event loop (asyncio.run).
    namespace = await anyio.to_thread.run_sync(run_python_blocks)
    # A client of a mount_into gateway hears of the mounted server's change.
    assert "['ResourceUpdated', 'ToolsListChanged']\n" \
        "['chainweaver://greetings/flows/hello/schema']\n" in namespace["printed"]
    server = namespace["server"]
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("hello", {"name": "Ada"})
        assert result.structured_content == {"text": "Hello, Ada!"}
        schema = json.loads((await client.read_resource(
            "chainweaver://flows/hello/schema"))[0].text)
        assert set(schema) == {"name", "version", "title", "description", "tool_name",
                               "input_schema", "output_schema"}

    secured = namespace["secured"]
    async with Client(secured.fastmcp) as client:
        # In memory there are no headers, so the bearer-token authenticator refuses.
        with pytest.raises(Exception, match="unauthenticated"):
            await client.call_tool("hello", {"name": "Ada"})
    assert namespace["audit_log"][-1].reason == "unauthenticated"
