"""The request-body limit docs/security.md states is the one the server enforces:
over streamable HTTP the MCP SDK answers a body over 4 MiB with HTTP 413 before
parsing it, and keeps serving; a large body under it is an ordinary call (issue 22,
item 11)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from support.procs import free_port, stop, wait_until_listening

pytestmark = pytest.mark.anyio

LIMIT = 4 * 1024 * 1024  # docs/security.md: "bodies over 4 MiB"

SERVER = textwrap.dedent("""
    import sys
    from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
    from chainweaver.mcp import FlowServer

    @tool(safety=ToolSafetyContract("read"))
    def measure(text: str) -> dict:
        "How long the text is."
        return {"length": len(text)}

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(measure)
    executor.registry.register_flow(Flow("measure", "Measures text.", [FlowStep("measure")]))
    FlowServer(executor).serve("streamable-http", port=int(sys.argv[1]))
""")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("body-limit") / "server.log"
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, "-c", SERVER, str(port)],
                                   stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until_listening(process, port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


def test_the_documented_limit_is_the_sdks() -> None:
    assert DEFAULT_MAX_REQUEST_BODY_SIZE == LIMIT


def post(url: str, body: bytes | Iterator[bytes]) -> httpx2.Response:
    headers = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    return httpx2.post(url, content=body, headers=headers, timeout=60)


def call(text: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "measure", "arguments": {"text": text}}}).encode()


async def measure(url: str, text: str) -> int:
    async with Client(StreamableHttpTransport(url), timeout=60) as client:
        result = await client.call_tool("measure", {"text": text})
    assert not result.is_error
    return json.loads(result.content[0].text)["length"]  # type: ignore[union-attr]


async def test_a_body_over_the_limit_gets_413_and_the_server_keeps_serving(url: str) -> None:
    over = call("x" * LIMIT)
    assert len(over) > LIMIT
    assert post(url, over).status_code == 413
    # Streamed without a Content-Length, counted as it arrives: refused all the same.
    chunks = (over[i:i + 65536] for i in range(0, len(over), 65536))
    assert post(url, chunks).status_code == 413
    just_over = call("x" * (LIMIT - len(call(""))) + "x")
    assert len(just_over) == LIMIT + 1
    assert post(url, just_over).status_code == 413
    assert await measure(url, "still serving") == len("still serving")


async def test_a_large_body_under_the_limit_is_an_ordinary_call(url: str) -> None:
    text = "y" * (LIMIT - 64 * 1024)  # the client's envelope fits in the rest
    assert await measure(url, text) == len(text)
