"""A FlowServer under a ``Namespace`` on ``server.fastmcp``, over real streamable HTTP
on 127.0.0.1 with JWT bearer tokens and per-caller views: each caller's server card
names what its lists name (namespaced), a subscribed client hears of the namespaced
schema it subscribed to on both eras, and a run read is hinted private on a server
whose lists every caller shares."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2 as httpx
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.auth.providers.jwt import JWTVerifier
from fastmcp.server.transforms import Namespace
from support.catalogue import build_catalogue
from support.mcp_client import RawResult
from support.notices import UPDATED, Heard, listening
from support.procs import serving_http as serving
from support.server_card import check_card, resource_uris, tool_names
from support.tokens import AUDIENCE, ISSUER, KeyPair

from chainweaver.mcp import Discovery, FlowServer, RunHistory, SecurityConfig, visible_claim

pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

KEYS = KeyPair()
SEARCH_SCHEMA = "chainweaver://shop/flows/product_search/schema"
ORDERS_SCHEMA = "chainweaver://shop/flows/order_status/schema"


def bearer(subject: str, teams: list[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS.token(subject, teams)}"}


def namespaced(**options: Any) -> FlowServer:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        run_history=RunHistory(), **options)
    server.fastmcp.add_transform(Namespace("shop"))
    return server


def viewed() -> FlowServer:
    verifier = JWTVerifier(public_key=KEYS.public_pem, issuer=ISSUER, audience=AUDIENCE)
    return namespaced(security=SecurityConfig(auth=verifier,
                                              visible=visible_claim("teams")))


async def test_each_callers_card_names_its_namespaced_lists() -> None:
    server = viewed()
    sam = bearer("sam", ["search-team"])
    async with serving(server) as url, httpx.AsyncClient() as http:
        card = await http.get(f"{url}/server-card", headers=sam)
        async with Client(StreamableHttpTransport(url, headers=sam)) as client:
            tools = {tool.name for tool in await client.list_tools()}
            resources = {str(r.uri) for r in await client.list_resources()}
    check_card(card.json())
    assert tool_names(card.json()) == tools == {"shop_product_search", "shop_failing_flow"}
    assert resource_uris(card.json()) == resources
    assert SEARCH_SCHEMA in resources
    assert "order_status" not in card.text and "price_quote" not in card.text


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_subscriber_hears_of_its_namespaced_schema(mode: str) -> None:
    server = viewed()
    registry = server.executor.registry
    heard = Heard()
    sam = bearer("sam", ["search-team"])
    async with serving(server) as url:
        transport = StreamableHttpTransport(url, headers=sam)
        if mode == "legacy":
            async with Client(transport, mode="legacy", message_handler=heard) as client:
                await client.list_tools()  # the session follows sam from here
                for uri in (SEARCH_SCHEMA, ORDERS_SCHEMA):
                    await client.session.subscribe_resource(uri)
                registry.register_flow(dataclasses.replace(
                    registry.get_flow("order_status"), version="3.0.0"))  # not sam's
                registry.register_flow(dataclasses.replace(
                    registry.get_flow("product_search"), version="3.0.0"))
                told = await heard.take(3)
        else:
            async with Client(transport) as client, \
                    listening(client.session, heard, [SEARCH_SCHEMA, ORDERS_SCHEMA]):
                registry.register_flow(dataclasses.replace(
                    registry.get_flow("order_status"), version="3.0.0"))
                registry.register_flow(dataclasses.replace(
                    registry.get_flow("product_search"), version="3.0.0"))
                told = await heard.take(3)
    updates = [notice for notice in told if notice.startswith(UPDATED)]
    assert updates == [f"{UPDATED} {SEARCH_SCHEMA}"]


async def test_a_run_read_is_private_on_a_shared_namespaced_server() -> None:
    server = namespaced(discovery=Discovery(cache_ttl=5))
    async with serving(server) as url, Client(StreamableHttpTransport(url)) as client:
        result = await client.call_tool("shop_product_search", {"query": "lamp"})
        run = f"chainweaver://shop/runs/{result.meta['chainweaver']['run_id']}"
        request = mcp_types.Request[dict[str, Any], str](method="resources/read",
                                                           params={"uri": run})
        read = (await client.session.send_request(request, RawResult)).model_dump(
            by_alias=True)
    assert (read["ttlMs"], read["cacheScope"]) == (5_000, "private")
