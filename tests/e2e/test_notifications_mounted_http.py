"""A FlowServer mounted with ``mount_into`` into a plain FastMCP gateway served over
real streamable HTTP on 127.0.0.1, with JWT bearer tokens verified by the gateway and
per-team views: on both eras each caller hears of the mounted server's changes under
the gateway's names, only in its own view, and of its own runs only (not of another
caller's run of a flow both see)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from fastmcp import Client, FastMCP
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.auth.providers.jwt import JWTVerifier
from support.catalogue import build_catalogue
from support.notices import PROMPTS, TOOLS, UPDATED, Heard, listening
from support.procs import free_port
from support.tokens import AUDIENCE, ISSUER, KeyPair

from chainweaver.mcp import FlowServer, RunHistory, SecurityConfig, ServingConfig, visible_claim

pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

KEYS = KeyPair()
SEARCH = "chainweaver://shop/flows/product_search/schema"
ORDERS = "chainweaver://shop/flows/order_status/schema"
RUNS = "chainweaver://shop/runs"


@asynccontextmanager
async def gateway(parent: FastMCP) -> AsyncIterator[str]:
    """``parent`` on streamable HTTP on a free loopback port, once it accepts."""
    port = free_port()
    task = asyncio.create_task(parent.run_async(
        "streamable-http", host="127.0.0.1", port=port, show_banner=False))
    try:
        for _ in range(200):  # bounded: until it accepts connections
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@asynccontextmanager
async def follower(url: str, subject: str, teams: list[str], mode: str
                   ) -> AsyncIterator[tuple[Client, Heard]]:
    heard = Heard()
    headers = {"Authorization": f"Bearer {KEYS.token(subject, teams)}"}
    transport = StreamableHttpTransport(url, headers=headers)
    uris = [SEARCH, ORDERS, RUNS]
    if mode == "legacy":
        async with Client(transport, mode=mode, message_handler=heard) as client:
            for uri in uris:
                await client.session.subscribe_resource(uri)
            yield client, heard
        return
    async with Client(transport) as client, listening(client.session, heard, uris):
        yield client, heard


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_gateway_clients_hear_the_mounted_servers_changes_in_their_view(
        mode: str) -> None:
    executor = build_catalogue()
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        run_history=RunHistory(),
                        serving=ServingConfig(change_debounce=0.01),
                        security=SecurityConfig(visible=visible_claim("teams")))
    parent = FastMCP("gateway", auth=JWTVerifier(public_key=KEYS.public_pem,
                                                 issuer=ISSUER, audience=AUDIENCE))
    server.mount_into(parent, namespace="shop")
    registry = executor.registry
    async with gateway(parent) as url, \
            follower(url, "sam", ["search-team", "pricing-team"], mode) as (_, sam), \
            follower(url, "olga", ["orders-team", "pricing-team"], mode) as (olga_client,
                                                                             olga):
        registry.register_flow(dataclasses.replace(registry.get_flow("product_search"),
                                                   version="3.0.0"))
        assert await sam.take(3) == sorted([TOOLS, PROMPTS, f"{UPDATED} {SEARCH}"])
        assert await olga.take(0) == []
        registry.register_flow(dataclasses.replace(registry.get_flow("order_status"),
                                                   version="3.0.0"))
        assert await olga.take(3) == sorted([TOOLS, PROMPTS, f"{UPDATED} {ORDERS}"])
        assert await sam.take(0) == []
        # Olga's run of a flow both see: told to her alone.
        await olga_client.call_tool("shop_price_quote", {"sku": "SKU-1"})
        told = await olga.take(2)
        assert {notice for notice in told if notice.startswith(UPDATED)} == {
            f"{UPDATED} {RUNS}"}
        assert await sam.take(0) == []
