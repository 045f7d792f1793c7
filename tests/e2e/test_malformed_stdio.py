"""Malformed ``prompts/get`` requests over a real stdio subprocess, on both protocol eras:
every one answers JSON-RPC -32602 naming what is wrong, and the server goes on serving.
(Streamable HTTP is covered property-based in tests/mcp/test_fuzz.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.transports import PythonStdioTransport
from mcp import MCPError

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "catalogue_server.py"
RawRequest = mcp_types.Request[dict[str, Any], str]
MALFORMED: list[tuple[dict[str, Any], str]] = [
    ({}, "prompts/get needs a 'name' (a string)"),
    ({"name": 7}, "prompts/get 'name' must be a string, got number"),
    ({"name": None}, "prompts/get 'name' must be a string, got null"),
    ({"name": ["order_status"]}, "prompts/get 'name' must be a string, got array"),
    ({"name": {"a": 1}, "arguments": {}}, "prompts/get 'name' must be a string, got object"),
    ({"name": "order_status", "arguments": ["A-1"]},
     "Prompt 'order_status': arguments must be an object of strings, got array"),
    ({"name": "order_status", "arguments": "A-1"},
     "Prompt 'order_status': arguments must be an object of strings, got string"),
    ({"name": "order_status", "arguments": {"order_id": 12}},
     "Prompt 'order_status': argument 'order_id' must be a string, got number"),
    ({"name": "write_flow", "arguments": {"query": False}},
     "Prompt 'write_flow': argument 'query' must be a string, got boolean"),
    ({"name": "never_existed", "arguments": {"query": False}},
     "Prompt 'never_existed': argument 'query' must be a string, got boolean"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_malformed_prompt_requests_over_stdio_are_invalid_params(
    mode: str, tmp_path: Path,
) -> None:
    transport = PythonStdioTransport(
        str(SERVER_SCRIPT), args=["stdio", "--expose"], python_cmd=sys.executable, keep_alive=False,
        log_file=tmp_path / "server-stderr.log",
    )
    async with Client(transport, mode=mode) as client:
        for params, message in MALFORMED:
            with pytest.raises(MCPError) as caught:
                await client.session.send_request(RawRequest(method="prompts/get",
                                                             params=params),
                                                  mcp_types.GetPromptResult)
            assert caught.value.error.model_dump() == {"code": -32602, "message": message,
                                                       "data": None}
        rendered = await client.get_prompt("order_status", {"order_id": "A-1"})
        assert rendered.messages
    assert "Traceback" not in (tmp_path / "server-stderr.log").read_text()
