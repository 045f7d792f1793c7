"""Discovery over real streamable HTTP on 127.0.0.1, with JWT bearer tokens and per-caller
views: each caller's server card (validated against the extension's schema), 401 for a
forged token, ETag and 304 across a governance change outside and inside the view, the
2026-07-28 caching hints on lists (none on 2025-11-25), and a ``traceparent`` sent in a
request's ``_meta`` carried into the flow's spans."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.auth.providers.jwt import JWTVerifier
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.catalogue import build_catalogue
from support.mcp_client import RawResult
from support.procs import serving_http as serving
from support.server_card import check_card, tool_names
from support.spans import recorded_spans
from support.tokens import AUDIENCE, ISSUER, KeyPair

from chainweaver.mcp import Discovery, FlowServer, SecurityConfig, visible_claim

SEARCH = {"product_search", "failing_flow"}
ORDERS = {"order_status", "price_quote"}
KEYS = KeyPair()
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


def viewed_server() -> FlowServer:
    verifier = JWTVerifier(public_key=KEYS.public_pem, issuer=ISSUER, audience=AUDIENCE)
    return FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(auth=verifier, visible=visible_claim("teams")),
                      discovery=Discovery(cache_ttl=20))


def bearer(subject: str, teams: list[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS.token(subject, teams)}"}


@pytest.mark.anyio
async def test_each_caller_gets_its_views_card_over_http() -> None:
    server = viewed_server()
    sam, olga = bearer("sam", ["search-team"]), bearer("olga", ["orders-team",
                                                               "pricing-team"])
    async with serving(server) as url, httpx.AsyncClient() as http:
        card_url = f"{url}/server-card"
        mine = await http.get(card_url, headers=sam)
        theirs = await http.get(card_url, headers=olga)
        anonymous = await http.get(card_url)
        forged = await http.get(card_url, headers={"Authorization": "Bearer forged"})
        tag = mine.headers["etag"]
        unchanged = await http.get(card_url, headers={**sam, "If-None-Match": tag})
        server.executor.registry.set_lifecycle("price_quote", "archived")  # olga's
        outside = await http.get(card_url, headers={**sam, "If-None-Match": tag})
        theirs_after = await http.get(card_url, headers={
            **olga, "If-None-Match": theirs.headers["etag"]})
        server.executor.registry.set_lifecycle("failing_flow", "archived")  # sam's
        inside = await http.get(card_url, headers={**sam, "If-None-Match": tag})
    for response in (mine, theirs, anonymous):
        assert response.status_code == 200
        check_card(response.json())
        assert response.json()["remotes"][0]["url"] == url
    assert tool_names(mine.json()) == SEARCH
    assert not any(name in mine.text for name in ORDERS)
    assert tool_names(theirs.json()) == ORDERS
    assert tool_names(anonymous.json()) == set()
    assert forged.status_code == 401 and "Bearer" in forged.headers["www-authenticate"]
    assert (unchanged.status_code, outside.status_code) == (304, 304)
    assert outside.headers["etag"] == tag
    assert theirs_after.status_code == 200 and "price_quote" not in theirs_after.text
    assert inside.status_code == 200 and tool_names(inside.json()) == {"product_search"}
    assert mine.headers["cache-control"] == "private, max-age=20"


async def raw_list(client: Client) -> dict[str, Any]:
    request = mcp_types.Request[dict[str, Any], str](method="tools/list", params={})
    return (await client.session.send_request(request, RawResult)).model_dump(by_alias=True)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_lists_carry_private_hints_on_2026_07_28_only(mode: str) -> None:
    server = viewed_server()
    async with serving(server) as url:
        transport = StreamableHttpTransport(url, headers=bearer("sam", ["search-team"]))
        async with Client(transport, mode=mode) as client:
            listed = await raw_list(client)
    assert {tool["name"] for tool in listed["tools"]} == SEARCH
    if mode == "auto":
        assert (listed["ttlMs"], listed["cacheScope"]) == (20_000, "private")
    else:
        assert "ttlMs" not in listed and "cacheScope" not in listed


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recorded_spans() as exporter:
        yield exporter


@pytest.mark.anyio
@pytest.mark.parametrize("stateless", [False, True])
async def test_a_traceparent_in_meta_is_the_flow_spans_trace(
        spans: InMemorySpanExporter, stateless: bool) -> None:
    """A JSON-RPC ``tools/call`` posted by hand (no client tracing of its own), its
    ``_meta`` carrying a W3C ``traceparent``: the flow's span and its steps' spans are
    in that trace, under the caller's span."""
    server = FlowServer(build_catalogue())
    meta = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01",
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "curl", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "order_status", "arguments": {"order_id": "A-1"},
                       "_meta": meta}}
    headers = {"Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
               "Mcp-Name": "order_status"}
    async with serving(server, stateless=stateless) as url, httpx.AsyncClient() as http:
        response = await http.post(url, json=body, headers=headers)
    assert response.status_code == 200 and '"isError":false' in response.text.replace(
        " ", "")
    finished = spans.get_finished_spans()
    flow = [s for s in finished if s.name == "chainweaver.flow order_status"]
    steps = [s for s in finished if s.name.startswith("chainweaver.step ")]
    assert len(flow) == 1 and len(steps) == 2
    for span in (*flow, *steps):
        assert format(span.context.trace_id, "032x") == TRACE_ID
    by_id = {span.context.span_id: span for span in finished}
    ancestor = flow[0]
    while ancestor.parent is not None and ancestor.parent.span_id in by_id:
        ancestor = by_id[ancestor.parent.span_id]
    assert ancestor.parent is not None
    assert format(ancestor.parent.span_id, "016x") == PARENT_SPAN
