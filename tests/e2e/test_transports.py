"""FlowServer over real transports: a stdio subprocess and streamable HTTP on loopback.

The server under test is ``tests/servers/catalogue_server.py``, a separate process
serving the shared catalogue, so what is checked is what a real client gets on the wire.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import PythonStdioTransport, StreamableHttpTransport
from mcp import MCPError
from mcp_types.version import LATEST_MODERN_VERSION
from support.catalogue import EXPOSED, build_catalogue
from support.procs import EXIT_TIMEOUT, STARTUP_TIMEOUT, free_port, stop, wait_until_listening

from chainweaver import ExposureConfigError
from chainweaver.mcp import GATE_REFUSED, FlowServer

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "catalogue_server.py"
LEGACY_VERSION = "2025-11-25"
# Expected version per client mode: "auto" negotiates the modern era; "legacy" pins
# the initialize handshake.
MODES = {"auto": LATEST_MODERN_VERSION, "legacy": LEGACY_VERSION}
TOKEN = "test-token-5150"


# ------------------------------------------------------------------------ stdio


@pytest.mark.anyio
@pytest.mark.parametrize("mode", list(MODES))
async def test_stdio_subprocess_lists_and_calls_tools(mode: str, tmp_path: Path) -> None:
    transport = PythonStdioTransport(
        str(SERVER_SCRIPT), args=["stdio"], python_cmd=sys.executable, keep_alive=False,
        log_file=tmp_path / "server-stderr.log",
    )
    async with Client(transport, mode=mode) as client:
        assert client.protocol_version == MODES[mode]
        assert sorted(t.name for t in await client.list_tools()) == sorted(EXPOSED)
        result = await client.call_tool("order_status", {"order_id": "A-42"})
        assert result.structured_content == {
            "order_id": "A-42", "status": "shipped",
            "summary": "Order A-42 is shipped with DHL.",
        }
        excluded = await client.call_tool("write_flow", {"query": "q"}, raise_on_error=False)
        assert excluded.is_error
        assert excluded.content[0].text == "Unknown tool: 'write_flow'"
        failed = await client.call_tool("failing_flow", {"query": "q"}, raise_on_error=False)
        assert failed.is_error
        again = await client.call_tool("price_quote", {"sku": "SKU-2", "quantity": 2})
        assert again.structured_content == {"sku": "SKU-2", "total_cents": 1998}
    # The construction-time warnings went to stderr, not the MCP channel.
    assert "is not exposed" in (tmp_path / "server-stderr.log").read_text()


def rpc(message_id: int, method: str, params: dict[str, Any]) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": message_id, "method": method,
                       "params": params}) + "\n"


def test_stdio_stdout_carries_nothing_but_json_rpc() -> None:
    # --noisy adds a flow whose tool print()s and logs. Without PYTHONUNBUFFERED the
    # printed text sits in the server's stdout buffer: it must still not reach the wire.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    process = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), "stdio", "--noisy"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )
    # If the server stops answering, readline() would block: kill it instead.
    watchdog = threading.Timer(STARTUP_TIMEOUT, process.kill)
    watchdog.start()
    try:
        requests = [
            rpc(1, "initialize", {"protocolVersion": LEGACY_VERSION, "capabilities": {},
                                  "clientInfo": {"name": "raw-test", "version": "0"}}),
            json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n",
            rpc(2, "tools/list", {}),
            rpc(3, "tools/call", {"name": "chatty", "arguments": {"text": "from-the-tool"}}),
            rpc(4, "tools/call", {"name": "order_status",
                                  "arguments": {"order_id": "A-9"}}),
        ]
        lines: list[str] = []
        for request in requests:
            process.stdin.write(request)
            process.stdin.flush()
            if '"id"' in request:
                lines.append(process.stdout.readline())
        # communicate() closes stdin: end of input, so the server shuts down.
        rest, stderr = process.communicate(timeout=EXIT_TIMEOUT)
    finally:
        watchdog.cancel()
        stop(process)
    lines += rest.splitlines(keepends=True)

    messages = [json.loads(line) for line in lines if line.strip()]
    assert len(messages) == len(lines)  # no blank or partial lines either
    assert all(m.get("jsonrpc") == "2.0" for m in messages)
    by_id = {m["id"]: m for m in messages if "id" in m}
    assert set(by_id) == {1, 2, 3, 4}
    assert by_id[1]["result"]["protocolVersion"] == LEGACY_VERSION
    assert {t["name"] for t in by_id[2]["result"]["tools"]} == set(EXPOSED) | {"chatty"}
    assert by_id[3]["result"]["content"][0]["text"] == '{"echo": "from-the-tool"}'
    assert by_id[4]["result"]["structuredContent"]["order_id"] == "A-9"
    # What the tool printed and logged went to stderr.
    assert "chatty_echo printing from-the-tool" in stderr
    assert "chatty_echo logging from-the-tool" in stderr


# ------------------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A streamable-HTTP catalogue server in a subprocess: (URL, audit log path)."""
    directory = tmp_path_factory.mktemp("http-server")
    audit = directory / "audit.jsonl"
    port = free_port()
    with open(directory / "output.log", "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), "streamable-http", "--port", str(port),
             "--token", TOKEN, "--audit", str(audit)],
            stdout=output, stderr=subprocess.STDOUT,
        )
        try:
            wait_until_listening(process, port)
            yield f"http://127.0.0.1:{port}/mcp", audit
        finally:
            stop(process)


def read_audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", list(MODES))
async def test_streamable_http_serves_tools_with_both_handshakes(
    mode: str, http_server: tuple[str, Path]
) -> None:
    url, audit = http_server
    caller = f"http-caller-{mode}"
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Caller": caller}
    async with Client(StreamableHttpTransport(url, headers=headers), mode=mode) as client:
        assert client.protocol_version == MODES[mode]
        tools = {t.name: t for t in await client.list_tools()}
        assert sorted(tools) == sorted(EXPOSED)
        assert tools["order_status"].meta["chainweaver"]["version"] == "2.1.0"
        result = await client.call_tool("product_search", {"query": f"lamp-{mode}"})
        assert result.structured_content["total"] == 3
        excluded = await client.call_tool("destructive_flow", {"query": "q"},
                                          raise_on_error=False)
        assert excluded.is_error
        assert excluded.content[0].text == "Unknown tool: 'destructive_flow'"

    # The authenticator read the HTTP headers: the caller id came from X-Caller.
    events = [e for e in read_audit(audit) if e["caller_id"] == caller]
    completed = [e for e in events if e["phase"] == "completed"
                 and e["name"] == "product_search"]
    assert len(completed) == 1
    text = result.content[0].text
    assert completed[0]["result_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert all(f"lamp-{mode}" not in json.dumps(e) for e in events)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", list(MODES))
async def test_streamable_http_refuses_a_wrong_token(
    mode: str, http_server: tuple[str, Path]
) -> None:
    url, audit = http_server
    caller = f"intruder-{mode}"
    headers = {"Authorization": "Bearer wrong", "X-Caller": caller}
    async with Client(StreamableHttpTransport(url, headers=headers), mode=mode) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("price_quote", {"sku": "S"})
        assert caught.value.error.code == GATE_REFUSED
        assert caught.value.error.data == {"reason": "unauthenticated"}
        # Lists pass the gate too; a refusal does not end the session.
        for _ in range(2):
            with pytest.raises(MCPError) as listing:
                await client.list_tools()
            assert listing.value.error.data == {"reason": "unauthenticated"}
    denied = [e for e in read_audit(audit)
              if e["decision"] == "denied" and e["name"] == "price_quote"]
    assert denied and all(e["caller_id"] is None for e in denied)
    assert all(e["caller_id"] != caller for e in read_audit(audit))


@pytest.mark.anyio
async def test_serve_rejects_an_unknown_transport() -> None:
    with pytest.raises(ExposureConfigError, match="transport"):
        await FlowServer(build_catalogue()).serve_async("sse")
