"""Over 2026-07-28 streamable HTTP (which decodes JSON nested ~1,000 levels deep), a
background task's arguments nested too deeply are refused with -32602, not -32603,
and the server logs no traceback and goes on serving. The in-memory twin is
tests/mcp/tasks/test_task_argument_depth.py; this one sends the bytes a client would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.procs import free_port, stop, wait_until_listening

pytestmark = [pytest.mark.slow, pytest.mark.tasks]

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "catalogue_server.py"
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        # Declaring the tasks extension makes an optional flow's call a task.
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/tasks": {}}}}


def nested(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def post(url: str, request_id: int, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "price_quote", "arguments": arguments, "_meta": META}}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Mcp-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "price_quote"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read().decode()
    except urllib.error.HTTPError as refused:
        text = refused.read().decode()
    return json.loads(text)  # type: ignore[no-any-return]


def test_deep_task_arguments_over_http_are_invalid_params(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, str(SERVER_SCRIPT), "streamable-http",
                                    "--port", str(port), "--tasks"],
                                   stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            url = f"http://127.0.0.1:{port}/mcp"
            for levels in (500, 800):
                answer = post(url, levels, {"sku": "SKU-1", "tags": nested(levels)})
                assert answer["error"] == {
                    "code": -32602, "message": "Invalid arguments for 'price_quote': "
                                               "nested more than 64 levels deep"}, answer
            # The deepest accepted arguments still make a task.
            created = post(url, 1, {"sku": "SKU-1", "tags": nested(63)})
            assert created["result"]["status"] == "working", created
        finally:
            stop(process)
    assert "Traceback" not in log.read_text()
