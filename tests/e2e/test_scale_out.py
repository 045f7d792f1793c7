"""Scaling out: several FlowServer processes behind one round-robin balancer.

Two ``hardened_server.py --stateless`` processes (``FlowServer.serve_async(...,
stateless=True)``) and one client whose every HTTP request goes to the next process in
turn, as behind a load balancer without sticky sessions. What was found to work:

- 2026-07-28 clients (fastmcp ``mode="auto"``, the default) send self-contained
  requests with no session at all, so they work against any set of processes;
- 2025-11-25 clients (``mode="legacy"``) open a session with ``initialize``; only
  ``stateless=True`` lets another process answer its later requests;
- raw JSON-RPC POSTs without ``Mcp-Session-Id`` (and without ``initialize``) work
  against stateless servers.

Each server appends its audit events to its own file, which shows the requests really
were spread over both processes.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp import MCPError
from support.procs import free_port, stop, wait_until_listening

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "hardened_server.py"
TOKEN = "scale-out-token"
ROUNDS = 6


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two stateless and two stateful (default) servers: ports and audit files."""
    directory = tmp_path_factory.mktemp("scale-out")
    started: list[tuple[subprocess.Popen, int, Path]] = []
    try:
        for stateless in (True, True, False, False):
            port = free_port()
            audit = directory / f"audit-{port}.jsonl"
            audit.touch()
            options = ["--port", str(port), "--token", f"ops={TOKEN}", "--audit", str(audit)]
            process = subprocess.Popen(
                [sys.executable, str(SERVER_SCRIPT), *options,
                 *(["--stateless"] if stateless else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            started.append((process, port, audit))
        for process, port, _ in started:
            wait_until_listening(process, port)
        yield {"stateless": [(port, audit) for _, port, audit in started[:2]],
               "stateful": [(port, audit) for _, port, audit in started[2:]]}
    finally:
        for process, _, _ in started:
            stop(process)


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each HTTP request to the next backend port in turn, like a load balancer."""

    def __init__(self, ports: Iterator[int], hits: Counter[int]) -> None:
        self.ports = ports
        self.hits = hits
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self.ports)
        self.hits[port] += 1
        request.url = request.url.copy_with(port=port)
        # Like a proxy that addresses each backend by its own address (nginx's default
        # for a single upstream): a backend bound to loopback accepts only its own port
        # in Host. A proxy that forwards another name needs --allowed-host / allowed_hosts.
        request.headers["Host"] = f"127.0.0.1:{port}"
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def balanced_client(ports: list[int], mode: str, hits: Counter[int]) -> Client:
    turns = itertools.cycle(ports)  # shared by every HTTP client the transport makes

    def factory(**options: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(**options, transport=RoundRobin(turns, hits))

    transport = StreamableHttpTransport(f"http://127.0.0.1:{ports[0]}/mcp",
                                        headers={"Authorization": f"Bearer {TOKEN}"},
                                        httpx_client_factory=factory)
    return Client(transport, mode=mode)


async def mixed_requests(client: Client) -> int:
    """ROUNDS x (tools/call, resources/read, prompts/get, tools/list); checks each answer."""
    done = 0
    for i in range(1, ROUNDS + 1):
        quote = await client.call_tool("price_quote", {"sku": f"S{i}", "quantity": i})
        assert quote.structured_content == {"sku": f"S{i}", "total_cents": 999 * i}
        schema = await client.read_resource("chainweaver://flows/price_quote/schema")
        assert json.loads(schema[0].text)["tool_name"] == "price_quote"
        prompt = await client.get_prompt("price_quote", {"sku": f"S{i}"})
        assert prompt.meta["chainweaver"]["arguments"]["sku"] == f"S{i}"
        assert "price_quote" in [t.name for t in await client.list_tools()]
        done += 3
    return done


def audited(audits: list[Path]) -> list[int]:
    """Completed calls, reads and renders per server, from each server's own audit file
    (lists are audited too, and clients also list on their own)."""
    return [sum(event["phase"] == "completed" and event["kind"] != "list"
                for event in map(json.loads, path.read_text().splitlines()))
            for path in audits]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_one_client_spread_over_two_stateless_servers_always_succeeds(
    backends: dict, mode: str
) -> None:
    ports, audits = zip(*backends["stateless"], strict=True)
    before = audited(list(audits))
    hits: Counter[int] = Counter()
    async with balanced_client(list(ports), mode, hits) as client:
        done = await mixed_requests(client)
    after = audited(list(audits))
    served = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(served) == done
    assert all(count > 0 for count in served)  # both processes answered gated requests
    assert all(hits[port] > ROUNDS for port in ports)


@pytest.mark.anyio
async def test_sessionless_clients_need_no_stateless_flag(backends: dict) -> None:
    # 2026-07-28 requests carry everything they need, so even default servers can share.
    ports, audits = zip(*backends["stateful"], strict=True)
    before = audited(list(audits))
    async with balanced_client(list(ports), "auto", Counter()) as client:
        done = await mixed_requests(client)
    served = [a - b for a, b in zip(audited(list(audits)), before, strict=True)]
    assert sum(served) == done and all(count > 0 for count in served)


@pytest.mark.anyio
async def test_handshake_clients_need_stateless_servers(backends: dict) -> None:
    # The counter-example: a 2025-11-25 session opened on one stateful process is
    # unknown to the other, so without stateless=True the next request fails.
    ports = [port for port, _ in backends["stateful"]]
    with pytest.raises(MCPError, match="Session not found"):
        async with balanced_client(ports, "legacy", Counter()) as client:
            await mixed_requests(client)


def test_raw_posts_without_a_session_alternate_between_stateless_servers(
    backends: dict,
) -> None:
    headers = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25", "Authorization": f"Bearer {TOKEN}"}
    with httpx2.Client() as http:
        for i, (port, _) in zip(range(1, 9), itertools.cycle(backends["stateless"])):
            body = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                    "params": {"name": "price_quote", "arguments": {"sku": "S", "quantity": i}}}
            response = http.post(f"http://127.0.0.1:{port}/mcp", headers=headers,
                                 content=json.dumps(body))
            assert response.status_code == 200
            assert "mcp-session-id" not in response.headers
            text = response.text
            answer = json.loads(text[text.index("{"):])  # one SSE "data:" line
            assert answer["id"] == i
            assert answer["result"]["structuredContent"] == {"sku": "S", "total_cents": 999 * i}
