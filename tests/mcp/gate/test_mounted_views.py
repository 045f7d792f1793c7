"""Per-caller views through FlowServer.mount_into: lists and completions through the
parent are authenticated, rate-limited, audited and narrowed to the caller's view
exactly as when the server stands alone (review finding: they were not)."""

from __future__ import annotations

import json
from typing import Any

import mcp_types
import pytest
from fastmcp import Client, FastMCP
from mcp import MCPError
from support.catalogue import build_catalogue
from support.views import NEVER, TEMPLATE, answer, renamed

from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FixedWindowRateLimiter,
    FlowServer,
    GateContext,
    SecurityConfig,
    Visibility,
)

pytestmark = pytest.mark.anyio
MODES = ["auto", "legacy"]
HIDDEN = "product_search"  # outside olga's view; the anonymous caller sees it


def deny_rule(caller: CallerIdentity, flow: Any) -> bool:
    return flow.name not in caller.claims.get("deny", [])


class Olga:
    """An authenticator whose caller the test can take away."""

    def __init__(self) -> None:
        self.known = True

    def __call__(self, ctx: GateContext) -> CallerIdentity | None:
        if not self.known:
            return None
        return CallerIdentity("olga", {"deny": [HIDDEN]}, subject="olga")


def mounted(namespace: str | None = None, **security: Any
            ) -> tuple[FlowServer, FastMCP, Olga, list[AuditEvent]]:
    events: list[AuditEvent] = []
    olga = Olga()
    security.setdefault("authenticator", olga)
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(audit_hook=events.append, **security,
                                                visible=Visibility(deny_rule, claims=("deny",))))
    parent = FastMCP("parent")
    server.mount_into(parent, namespace=namespace)
    return server, parent, olga, events


async def listed(client: Client) -> dict[str, set[str]]:
    return {"tools": {t.name for t in await client.list_tools()},
            "resources": {str(r.uri) for r in await client.list_resources()},
            "templates": {t.uri_template for t in await client.list_resource_templates()},
            "prompts": {p.name for p in await client.list_prompts()}}


@pytest.mark.parametrize("mode", MODES)
async def test_mounted_lists_are_the_standalone_lists_of_the_callers_view(mode: str) -> None:
    server, parent, _, _ = mounted()
    async with Client(server.fastmcp, mode=mode) as client:
        standalone = await listed(client)
    async with Client(parent, mode=mode) as client:
        through_parent = await listed(client)
    assert through_parent == standalone
    assert HIDDEN not in through_parent["tools"]
    assert not any(HIDDEN in uri for uri in through_parent["resources"])
    assert not any(p.startswith(HIDDEN) for p in through_parent["prompts"])
    assert "price_quote" in through_parent["tools"]


@pytest.mark.parametrize("mode", MODES)
async def test_mounted_index_guide_and_calls_follow_the_callers_view(mode: str) -> None:
    _, parent, _, _ = mounted()
    async with Client(parent, mode=mode) as client:
        index = json.loads((await client.read_resource("chainweaver://flows"))[0].text)
        guide = (await client.get_prompt("chainweaver_guide")).messages[0].content.text
        calls = [renamed(await answer(lambda n=name: client.session.call_tool(
            n, {"query": "q"})), name, NEVER) for name in (HIDDEN, NEVER)]
    assert HIDDEN not in {f["name"] for f in index["flows"]}
    assert f"`{HIDDEN}`" not in guide
    assert calls[0] == calls[1]


@pytest.mark.parametrize("mode", MODES)
async def test_mounted_lists_and_completions_are_authenticated_and_audited(mode: str) -> None:
    _, parent, olga, events = mounted(namespace="shop")
    olga.known = False
    refused = {"code": GATE_REFUSED, "message": "Request refused: unauthenticated",
               "data": {"reason": "unauthenticated"}}
    template = mcp_types.ResourceTemplateReference(uri=TEMPLATE.replace("://", "://shop/"))
    async with Client(parent, mode=mode) as client:
        requests = [client.list_tools, client.list_resources,
                    client.list_resource_templates, client.list_prompts,
                    lambda: client.complete(template,
                                            {"name": "published_name", "value": ""})]
        if mode == "legacy":  # the level of the mounted server's run log messages
            requests.append(lambda: client.set_logging_level("debug"))
        for request in requests:
            with pytest.raises(MCPError) as caught:
                await request()
            assert caught.value.error.model_dump() == refused
    set_level = [("subscription", "logging/setLevel", "denied")] if mode == "legacy" else []
    assert [(e.kind, e.name, e.decision) for e in events] == [
        ("list", "tools/list", "denied"), ("list", "resources/list", "denied"),
        ("list", "resources/templates/list", "denied"), ("list", "prompts/list", "denied"),
        ("completion", template.uri, "denied"), *set_level]


async def test_mounted_lists_spend_the_rate_budget() -> None:
    _, parent, _, _ = mounted(rate_limiter=FixedWindowRateLimiter(2, per_name=True))
    async with Client(parent) as client:
        await client.list_tools()
        await client.list_tools()
        with pytest.raises(MCPError) as caught:
            await client.list_tools()
        assert caught.value.error.data == {"reason": "rate_limited"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("namespace", [None, "shop"])
async def test_the_parent_completes_a_mounted_servers_prompts_and_template(
        mode: str, namespace: str | None) -> None:
    _, parent, _, _ = mounted(namespace=namespace)
    prefix = f"{namespace}_" if namespace else ""
    uri = TEMPLATE.replace("://", f"://{namespace}/") if namespace else TEMPLATE
    template = mcp_types.ResourceTemplateReference(uri=uri)
    async with Client(parent, mode=mode) as client:
        offered = (await client.complete(template,
                                         {"name": "published_name", "value": ""})).values
        # The same answer as a name that never existed: empty.
        hidden, never = [(await client.complete(mcp_types.PromptReference(
            name=f"{prefix}{name}"), {"name": "query", "value": ""})).values
            for name in (HIDDEN, NEVER)]
        unprefixed = (await client.complete(mcp_types.ResourceTemplateReference(
            uri=TEMPLATE), {"name": "published_name", "value": ""})).values
    assert "price_quote" in offered and HIDDEN not in offered
    assert hidden == never == []
    assert unprefixed == (offered if namespace is None else [])


async def test_the_parents_own_completion_handler_and_other_mounts_still_answer() -> None:
    parent = FastMCP("parent")

    @parent.prompt
    def mine(x: str) -> str:
        """The parent's own prompt (FastMCP 4.2 completes only references that exist)."""
        return x

    @parent.completion
    def own(ref: Any, argument: Any, context: Any = None) -> list[str]:
        return ["parent's own"] if getattr(ref, "name", None) == "mine" else []

    first = FlowServer(build_catalogue(), expose_schemas=True)
    second = FlowServer(build_catalogue(), expose_schemas=True)
    first.mount_into(parent, namespace="one")
    second.mount_into(parent, namespace="two")
    async with Client(parent) as client:
        values = {}
        for uri in (TEMPLATE.replace("://", "://one/"), TEMPLATE.replace("://", "://two/")):
            values[uri] = (await client.complete(mcp_types.ResourceTemplateReference(
                uri=uri), {"name": "published_name", "value": "price"})).values
        mine = (await client.complete(mcp_types.PromptReference(name="mine"),
                                      {"name": "x", "value": ""})).values
    assert list(values.values()) == [["price_quote"], ["price_quote"]]
    assert mine == ["parent's own"]
