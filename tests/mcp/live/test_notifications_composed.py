"""Change notifications under a ``Namespace`` on ``server.fastmcp`` name resources as
the client lists them (``chainweaver://shop/...``), on both protocol eras: a client
subscribed to a namespaced schema or to its runs is told of them, and told nothing of
a flow outside its view, nor of a resource the server disabled."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from fastmcp import Client
from fastmcp.resources import Resource
from fastmcp.server.transforms import Namespace
from support.catalogue import build_catalogue
from support.notices import PROMPTS, TOOLS, UPDATED, Heard, listening

from chainweaver import Flow, FlowExecutor
from chainweaver.mcp import FlowServer, RunHistory, SecurityConfig
from chainweaver.mcp.hooks import CallerIdentity

pytestmark = [pytest.mark.anyio,
              # 2025-11-25 clients subscribe the old way, on purpose.
              pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

SCHEMA = "chainweaver://shop/flows/order_status/schema"
HIDDEN_SCHEMA = "chainweaver://shop/flows/product_search/schema"
RUNS = "chainweaver://shop/runs"


def not_search(caller: CallerIdentity, flow: Flow) -> bool:
    return flow.name != "product_search"


def namespaced() -> tuple[FlowExecutor, FlowServer]:
    executor = build_catalogue()
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        run_history=RunHistory(),
                        security=SecurityConfig(visible=not_search))
    server.fastmcp.add_transform(Namespace("shop"))
    return executor, server


def new_version(executor: FlowExecutor, name: str) -> None:
    current = executor.registry.get_flow(name)
    executor.registry.register_flow(dataclasses.replace(current, version="3.0.0"))


async def told_under_namespace(client: Client, executor: FlowExecutor,
                               heard: Heard) -> None:
    listed = {str(resource.uri) for resource in await client.list_resources()}
    assert SCHEMA in listed and HIDDEN_SCHEMA not in listed
    new_version(executor, "order_status")
    assert await heard.take(3) == sorted([PROMPTS, TOOLS, f"{UPDATED} {SCHEMA}"])
    # A flow outside the view changes: nothing is said, under any name.
    new_version(executor, "product_search")
    assert await heard.take(0) == []
    # A run's status changes: its listing, where the client reads it, is updated.
    await client.call_tool("shop_price_quote", {"sku": "SKU-1"})
    # (A 2025-11-25 client also gets the call's progress.)
    updates = {notice for notice in await heard.take(2) if notice.startswith(UPDATED)}
    assert updates == {f"{UPDATED} {RUNS}"}


async def test_a_legacy_session_hears_of_namespaced_resources() -> None:
    executor, server = namespaced()
    heard = Heard()
    async with Client(server.fastmcp, mode="legacy", message_handler=heard) as client:
        for uri in (SCHEMA, HIDDEN_SCHEMA, RUNS):
            await client.session.subscribe_resource(uri)
        await told_under_namespace(client, executor, heard)


async def test_a_listen_stream_hears_of_namespaced_resources() -> None:
    executor, server = namespaced()
    heard = Heard()
    async with Client(server.fastmcp) as client, \
            listening(client.session, heard, [SCHEMA, HIDDEN_SCHEMA, RUNS]):
        await told_under_namespace(client, executor, heard)


async def test_a_resource_the_server_disabled_is_not_named_in_notices() -> None:
    # server.fastmcp.disable() only marks what it hides; lists leave it out at the end.
    executor = build_catalogue()
    server = FlowServer(executor, expose_schemas=True)
    disabled = "chainweaver://flows/order_status/schema"
    server.fastmcp.disable(names={disabled})
    heard = Heard()
    async with Client(server.fastmcp) as client, \
            listening(client.session, heard, [disabled]):
        assert disabled not in {str(resource.uri) for resource in
                                await client.list_resources()}
        new_version(executor, "order_status")
        assert await heard.take(1) == [TOOLS]


class CountingNamespace(Namespace):
    """A ``Namespace`` counting the times resources are listed through it."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self.listings = 0

    async def list_resources(self, resources: Sequence[Resource]) -> Sequence[Resource]:
        self.listings += 1
        return await super().list_resources(resources)


async def test_a_run_nobody_listens_for_costs_no_listing_of_resources() -> None:
    """A run's status changes twice per call (inside the call): its URIs were named
    through the server's transforms each time, before anybody was found to tell."""
    executor = build_catalogue()
    server = FlowServer(executor, run_history=RunHistory())
    counting = CountingNamespace("shop")
    server.fastmcp.add_transform(counting)
    async with Client(server.fastmcp) as client:  # 2026-07-28: it listens for nothing
        await client.call_tool("shop_price_quote", {"sku": "SKU-1"})  # first: warmed up
        before = counting.listings
        await client.call_tool("shop_price_quote", {"sku": "SKU-1"})
        assert counting.listings == before
