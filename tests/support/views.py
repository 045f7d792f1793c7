"""Leak checks for per-caller views: what one caller sees, and that every flow outside
its view answers exactly like a name that never existed (in memory or over HTTP)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types
from fastmcp import Client
from mcp import MCPError

GUIDE = "chainweaver_guide"
INDEX = "chainweaver://flows"
TEMPLATE = "chainweaver://flows/{published_name}/schema"
NEVER = "zz_never_existed"
# Flows of tests/support/catalogue.py that are exposed, and the team owning each.
OWNERS = {"product_search": "search-team", "failing_flow": "search-team",
          "order_status": "orders-team", "price_quote": "pricing-team"}
# Arguments each exposed flow's tool and invocation prompt accept.
ARGUMENTS = {"product_search": {"query": "lamp"}, "failing_flow": {"query": "x"},
             "order_status": {"order_id": "A-1"}, "price_quote": {"sku": "SKU-1"}}


def schema_uri(name: str) -> str:
    return f"chainweaver://flows/{name}/schema"


async def answer(request: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """A request's answer as plain data: its result, or its JSON-RPC error."""
    try:
        result = await request()
    except MCPError as error:
        return {"error": error.error.model_dump()}
    return {"result": result.model_dump(exclude_none=True)}


def renamed(data: Any, old: str, new: str) -> Any:
    """``data`` as it would read had it been about ``new`` instead of ``old``."""
    return json.loads(json.dumps(data).replace(old, new))


async def answers_for(client: Client, name: str) -> dict[str, Any]:
    """Every kind of request about the flow (or name) ``name``, answered."""
    session = client.session
    arguments = ARGUMENTS.get(name, {"query": "x"})
    prompt_args = {key: str(value) for key, value in arguments.items()}
    prompt_ref = mcp_types.PromptReference(name=name)
    template_ref = mcp_types.ResourceTemplateReference(uri=TEMPLATE)
    first = next(iter(arguments))
    return {
        "call": await answer(lambda: session.call_tool(name, arguments)),
        "read": await answer(lambda: session.read_resource(schema_uri(name))),
        "prompt": await answer(lambda: session.get_prompt(name, prompt_args)),
        "authored": await answer(lambda: session.get_prompt(f"{name}__compare",
                                                            {"first": "a", "second": "b"})),
        "complete_prompt": await answer(lambda: session.complete(
            prompt_ref, {"name": first, "value": ""})),
        "complete_template": (await client.complete(
            template_ref, {"name": "published_name", "value": name})).values,
    }


async def assert_view(client: Client, visible: set[str]) -> None:
    """``client`` sees exactly the flows ``visible`` in every primitive, and each other
    exposed flow answers like :data:`NEVER`, which never existed."""
    hidden = set(OWNERS) - visible
    tools = {tool.name for tool in await client.list_tools()}
    assert tools & set(OWNERS) == visible
    resources = {str(r.uri) for r in await client.list_resources()}
    assert resources == {INDEX, *(schema_uri(name) for name in visible)}
    prompts = {p.name for p in await client.list_prompts()}
    assert {p.split("__")[0] for p in prompts} - {GUIDE} == visible
    index = json.loads((await client.read_resource(INDEX))[0].text)
    assert {flow["name"] for flow in index["flows"]} == visible
    guide = (await client.get_prompt(GUIDE)).messages[0].content.text
    assert all(f"`{name}`" in guide for name in visible)
    template_ref = mcp_types.ResourceTemplateReference(uri=TEMPLATE)
    completed = await client.complete(template_ref, {"name": "published_name", "value": ""})
    assert set(completed.values) == visible
    never = await answers_for(client, NEVER)
    for name in hidden:
        assert name not in guide and name not in json.dumps(index)
        assert renamed(await answers_for(client, name), name, NEVER) == never, name
    for name in visible:
        assert renamed(await answers_for(client, name), name, NEVER) != never, name
