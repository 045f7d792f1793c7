"""Under a transform on ``server.fastmcp`` (a ``Namespace``, the tool forms) the server
card names exactly what the same caller's lists name, through the ASGI app and
``FlowServer.server_card()``, and still nothing outside the caller's view."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from fastmcp.server.transforms import Namespace
from support.catalogue import build_catalogue
from support.server_card import (
    CARD_PATH,
    asgi_client,
    check_card,
    primitives,
    prompt_names,
    resource_uris,
    tool_names,
)

from chainweaver import Flow
from chainweaver.mcp import FlowServer, RunHistory, SecurityConfig, ServingConfig
from chainweaver.mcp.hooks import CallerIdentity

HIDDEN = "product_search"  # outside every caller's view here


def not_search(caller: CallerIdentity, flow: Flow) -> bool:
    return flow.name != HIDDEN


async def lists(server: FlowServer) -> dict[str, Any]:
    async with Client(server.fastmcp) as client:
        return {
            "tools": {tool.name for tool in await client.list_tools()},
            "resources": {str(resource.uri) for resource in await client.list_resources()},
            "templates": [t.uri_template for t in await client.list_resource_templates()],
            "prompts": {prompt.name for prompt in await client.list_prompts()},
        }


def named(card: dict[str, Any]) -> dict[str, Any]:
    return {"tools": tool_names(card), "resources": resource_uris(card),
            "templates": [t["uriTemplate"] for t in primitives(card)["resourceTemplates"]],
            "prompts": prompt_names(card)}


@pytest.mark.anyio
@pytest.mark.parametrize("tool_forms", [False, True])
async def test_a_namespaced_servers_card_names_what_its_lists_name(tool_forms: bool) -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        run_history=RunHistory(),
                        serving=ServingConfig(resources_as_tools=tool_forms,
                                              prompts_as_tools=tool_forms),
                        security=SecurityConfig(visible=not_search))
    server.fastmcp.add_transform(Namespace("shop"))  # after the server was built
    async with asgi_client(server) as http:
        response = await http.get(CARD_PATH)
    card = response.json()
    check_card(card)
    listed = await lists(server)
    assert named(card) == listed
    assert "shop_price_quote" in listed["tools"]
    assert "chainweaver://shop/flows/price_quote/schema" in listed["resources"]
    assert "chainweaver://shop/runs/{run_id}" in listed["templates"]
    assert ("shop_read_resource" in listed["tools"]) is tool_forms
    assert server.server_card() == card  # what `chainweaver card` prints
    assert server.registry_entry()["_meta"][
        "io.modelcontextprotocol.registry/publisher-provided"]["chainweaver"]["tools"] == \
        [tool["name"] for tool in primitives(card)["tools"]]
    # The flow outside the view is named nowhere, under any name.
    assert HIDDEN not in response.text


@pytest.mark.anyio
async def test_what_the_server_disabled_is_not_on_its_card() -> None:
    """``server.fastmcp.disable()`` adds a visibility transform, which only marks what
    it hides (the server leaves marked components out of its lists at the end): the
    card named the disabled tool, prompt and schema resource."""
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    server.fastmcp.disable(names={"price_quote", "chainweaver://flows/price_quote/schema"})
    card = server.server_card()
    check_card(card)
    listed = await lists(server)
    assert named(card) == listed
    assert "price_quote" not in listed["tools"] | listed["prompts"]
    assert "order_status" in listed["tools"]
