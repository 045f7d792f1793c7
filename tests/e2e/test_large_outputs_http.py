"""Outputs of 0.9, 1.1, 5 and 50 MB over real streamable HTTP on both eras, with and
without a run history, and over stdio: every message a standard client receives (the
MCP SDK client refuses a server-sent event above 1 MiB), whole reads that could not
reach it are refused naming the ranges, and reading in ranges gives back the bytes
whose digest the audit recorded (issue 32, item 8)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import PythonStdioTransport, StreamableHttpTransport
from mcp import MCPError
from support.procs import free_port, stop, wait_until_listening

from chainweaver.mcp.gate.body_cap import MAX_RANGE_BYTES
from chainweaver.mcp.hooks import bounded_text

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

SERVER = Path(__file__).resolve().parents[1] / "servers" / "large_outputs_server.py"
MODES = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
MB = 1_000_000


class Served:
    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log

    def audited(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line[6:]) for line in lines if line.startswith("AUDIT ")]


@pytest.fixture(scope="module", params=["spill", "history"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("large") / "server.log"
    port = free_port()
    extra = ["--history"] if request.param == "history" else []
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(SERVER), "streamable-http", str(port), *extra],
            stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            yield Served(f"http://127.0.0.1:{port}/mcp", log)
        finally:
            stop(process)


async def read_back(client: Client, uri: str, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        part = await client.read_resource(
            f"{uri}?offset={len(data)}&length={MAX_RANGE_BYTES}")
        chunk = base64.b64decode(part[0].blob)
        assert 0 < len(chunk) <= MAX_RANGE_BYTES
        data += chunk
    return bytes(data)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("flow", "size", "ch"), [
    ("blob", 900_000, "x"), ("blob", 900_000, '"'), ("typed_blob", 900_000, "x"),
    # 900 KB and 800 KB of UTF-8; at 2026-07-28 the SDK's HTTP transport escapes each
    # character outside ASCII (\uXXXX, twice beyond the BMP): 1.8 and 2.4 MB as sent.
    ("blob", 300_000, "中"), ("blob", 200_000, "😀"),
    ("blob", int(1.1 * MB), "x"), ("blob", 5 * MB, "x"), ("blob", 50 * MB, "x")])
async def test_every_size_reaches_the_client_and_reads_back_as_audited(
        served: Served, mode: str, flow: str, size: int, ch: str) -> None:
    async with Client(StreamableHttpTransport(served.url), mode=mode, timeout=120) as client:
        result = await client.call_tool(flow, {"n": size, "ch": ch}, raise_on_error=False)
        expected = json.dumps({"data": ch * size}, ensure_ascii=False).encode()
        links = [block for block in result.content if block.type == "resource_link"]
        if not links:  # it fit one message: the output itself
            assert not result.is_error and result.content[0].text.encode() == expected
            return
        output = result.meta["chainweaver"]["output"]
        assert output["size"] == len(expected) and str(links[0].uri) == output["uri"]
        audited = [e for e in served.audited() if e["kind"] == "tool"][-1]
        assert (audited["result_sha256"], audited["result_length"]) == (
            hashlib.sha256(expected).hexdigest(), len(expected))
        if len(expected) > MAX_RANGE_BYTES * 2:
            with pytest.raises(MCPError) as whole:
                await client.read_resource(output["uri"])
            assert whole.value.error.code == -32602
            assert f"of at most {MAX_RANGE_BYTES} bytes" in whole.value.error.message
        data = await read_back(client, output["uri"], output["size"])
        assert hashlib.sha256(data).hexdigest() == audited["result_sha256"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("query", ["offset=" + "9" * 5000, "length=" + "1" * 5000])
async def test_range_numbers_past_pythons_digit_limit_are_invalid_params(
        served: Served, mode: str, query: str) -> None:
    # int() refuses text of more than 4,300 digits: once -32603 (and code 0 with
    # Python's text at 2025-11-25), now the documented -32602, read and audited.
    async with Client(StreamableHttpTransport(served.url), mode=mode) as client:
        result = await client.call_tool("blob", {"n": 2 * MB}, raise_on_error=False)
        uri = f"{result.meta['chainweaver']['output']['uri']}?{query}"
        with pytest.raises(MCPError) as caught:
            await client.read_resource(uri)
        assert (await client.read_resource(uri.split("?")[0] + "?offset=0"))[0].blob
    name = query.split("=")[0]
    low, high = (0, 2**53) if name == "offset" else (1, MAX_RANGE_BYTES)
    assert caught.value.error.code == -32602
    assert caught.value.error.message == (f"Invalid run resource URI {uri!r}: {name} must "
                                          f"be a whole number from {low} to {high}")
    assert [e["outcome"] for e in served.audited()
            if e["kind"] == "resource" and e["name"] == bounded_text(uri)] == ["error"]


async def test_escaping_can_make_a_whole_read_too_large_and_an_open_range_reads_one_message(
        served: Served) -> None:
    # 600 KB of JSON, under the budget as bytes: read whole, each backslash is escaped
    # once more, which no client could receive. An open range reads one message's worth.
    async with Client(StreamableHttpTransport(served.url), mode="legacy") as client:
        result = await client.call_tool("blob", {"n": 300_000, "ch": "\\"},
                                         raise_on_error=False)
        uri = result.meta["chainweaver"]["output"]["uri"]
        with pytest.raises(MCPError) as whole:
            await client.read_resource(uri)
        assert "would take" in whole.value.error.message
        first = await client.read_resource(f"{uri}?offset=0")
        assert len(base64.b64decode(first[0].blob)) == MAX_RANGE_BYTES


async def test_over_stdio_a_5_mb_output_is_a_link_too(tmp_path: Path) -> None:
    transport = PythonStdioTransport(str(SERVER), args=["stdio"], python_cmd=sys.executable,
                                     keep_alive=False, log_file=tmp_path / "stderr.log")
    async with Client(transport, mode="legacy", timeout=120) as client:
        result = await client.call_tool("blob", {"n": 5 * MB}, raise_on_error=False)
        output = result.meta["chainweaver"]["output"]
        data = await read_back(client, output["uri"], output["size"])
    assert json.loads(data) == {"data": "x" * 5 * MB}
