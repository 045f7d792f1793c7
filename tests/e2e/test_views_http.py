"""Standard token auth and per-caller views over streamable HTTP, against
``tests/servers/views_server.py`` subprocesses: JWTs signed by a test key pair, two
callers with disjoint views (each leak-checked on both eras), 401 for a missing or
badly signed token, and one Redis rate budget held across two replicas."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp import MCPError
from support.procs import free_port, stop, wait_until_listening
from support.tokens import KeyPair
from support.views import assert_view

from chainweaver.mcp import GATE_REFUSED

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "views_server.py"
SEARCH = {"product_search", "failing_flow"}
ORDERS = {"order_status", "price_quote"}


def start(directory: Path, *options: str) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = directory / f"server-{port}.log"
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, str(SERVER_SCRIPT), "--port", str(port),
                                    *options], stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until_listening(process, port)
    except Exception:
        stop(process)
        raise
    return process, f"http://127.0.0.1:{port}/mcp", log


@pytest.fixture(scope="module")
def keys() -> KeyPair:
    return KeyPair()


@pytest.fixture(scope="module")
def server(keys: KeyPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("views-http")
    audit = directory / "audit.jsonl"
    process, url, log = start(directory, "--public-key",
                              str(keys.write_public(directory / "key.pem")),
                              "--audit-log", str(audit))
    try:
        yield {"url": url, "audit": audit}
    finally:
        stop(process)
    assert "Traceback" not in log.read_text()


def client(url: str, token: str | None, mode: str = "auto") -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(StreamableHttpTransport(url, headers=headers), mode=mode)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_two_callers_see_disjoint_views_and_nothing_else(
        server: dict[str, Any], keys: KeyPair, mode: str) -> None:
    sam = keys.token("sam", ["search-team"])
    olga = keys.token("olga", ["orders-team", "pricing-team"])
    async with client(server["url"], sam, mode) as c:
        await assert_view(c, SEARCH)
    async with client(server["url"], olga, mode) as c:
        await assert_view(c, ORDERS)
    async with client(server["url"], keys.token("nina", []), mode) as c:
        await assert_view(c, set())


@pytest.mark.anyio
async def test_the_audit_names_the_token_caller_and_never_a_hidden_flow(
        server: dict[str, Any], keys: KeyPair) -> None:
    offset = server["audit"].stat().st_size
    async with client(server["url"], keys.token("olga", ["orders-team"])) as c:
        await c.session.call_tool("order_status", {"order_id": "A-1"})
        await c.session.call_tool("product_search", {"query": "q"})
    with open(server["audit"], "rb") as sink:
        sink.seek(offset)
        events = [json.loads(line) for line in sink.read().decode().splitlines()]
    calls = [(e["name"], e["flow_name"], e["phase"]) for e in events if e["kind"] == "tool"]
    assert calls == [("order_status", "order_status", "decision"),
                     ("order_status", "order_status", "completed"),
                     ("product_search", None, "decision"),
                     ("product_search", None, "completed")]
    assert {e["caller_id"] for e in events} == {"client-olga|olga"}


def rpc(url: str, token: str | None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return httpx2.post(url, json=body, headers=headers, timeout=30)


def test_no_token_a_bad_signature_or_a_stale_token_get_401(server: dict[str, Any],
                                                            keys: KeyPair) -> None:
    forger = KeyPair()
    for token in (None, "not-a-jwt", forger.token("sam", ["search-team"]),
                  keys.token("sam", ["search-team"], expires_in=-120),
                  keys.token("sam", ["search-team"], aud="someone-else")):
        response = rpc(server["url"], token)
        assert response.status_code == 401, token
        assert response.headers["www-authenticate"].startswith("Bearer")


def audit_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.anyio
async def test_two_replicas_share_one_redis_rate_budget(
        keys: KeyPair, redis_url: str, tmp_path: Path) -> None:
    key = str(keys.write_public(tmp_path / "key.pem"))
    budget = 6
    options = ["--public-key", key, "--rate-limit", str(budget), "--rate-redis", redis_url,
               "--rate-prefix", f"test:{tmp_path.name}", "--stateless"]
    audits = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    replicas = [start(tmp_path, *options, "--audit-log", str(audit)) for audit in audits]
    token = keys.token("olga", ["pricing-team"])
    try:
        outcomes = []
        async with client(replicas[0][1], token) as first, \
                client(replicas[1][1], token) as second:
            for turn in range(10):
                try:
                    result = await (first, second)[turn % 2].call_tool(
                        "price_quote", {"sku": "S"})
                    outcomes.append("ok" if not result.is_error else "error")
                except MCPError as refused:
                    assert refused.error.code == GATE_REFUSED
                    outcomes.append(refused.error.data["reason"])
        # Every gated request counts (the client lists tools around its calls too):
        # together the replicas admitted exactly the budget, then refused everything.
        decisions = [[e for e in audit_events(audit) if e["phase"] == "decision"]
                     for audit in audits]
        allowed = [sum(e["decision"] == "allowed" for e in each) for each in decisions]
        assert sum(allowed) == budget and all(allowed), allowed
        assert {e["reason"] for each in decisions for e in each
                if e["decision"] == "denied"} == {"rate_limited"}
        assert outcomes[0] == "ok" and outcomes[-2:] == ["rate_limited"] * 2
        # Another caller has a budget of its own, on either replica.
        async with client(replicas[1][1], keys.token("sam", ["search-team"])) as other:
            assert not (await other.session.call_tool("product_search",
                                                      {"query": "q"})).is_error
    finally:
        for process, _, _ in replicas:
            stop(process)
