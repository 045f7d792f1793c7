"""Live governance: the published surface follows the registry while serving.

Every change swaps in a new snapshot before it returns (no request starting afterwards
sees a retired flow, in any primitive), each request uses the snapshot it started
with, cursors belong to one snapshot, and clients are told what changed in their view,
on both protocol eras, in memory (stdio and HTTP: tests/e2e/test_live_transports.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from collections.abc import Callable
from typing import Any

import mcp_types
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.dependencies import get_context
from mcp import MCPError
from mcp.client.subscriptions import listen
from support.catalogue import build_catalogue
from support.mcp_client import complete, complete_template

from chainweaver import (
    ExposureConfigError,
    Flow,
    FlowExecutor,
    FlowPrompt,
    FlowRegistry,
    FlowStep,
    PromptMessage,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import ExposurePolicy, FlowServer, ServingConfig, schema_uri
from chainweaver.mcp.fastmcp_seams import (
    forget_request_handler,
    install_input_schema_lookup,
    low_level_server,
    on_connection_close,
)
from chainweaver.mcp.live.cursors import LIST_AGAIN
from chainweaver.mcp.publish.exposure import Exposure
from chainweaver.mcp.publish.live_exposure import LiveExposure

pytestmark = [pytest.mark.anyio,
              # 2025-11-25 clients subscribe the old way, on purpose.
              pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

MODES = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
NEVER = "never_existed"
RETIRE: dict[str, Callable[[FlowRegistry], Any]] = {
    "archive": lambda registry: registry.set_lifecycle("product_search", "archived"),
    "unregister": lambda registry: registry.unregister("product_search"),
}


def serving(executor: FlowExecutor | None = None, **options: Any) -> FlowServer:
    options.setdefault("expose_schemas", True)
    options.setdefault("expose_prompts", True)
    return FlowServer(executor or build_catalogue(), **options)


async def error_of(call: Any, name: str = "") -> tuple[int, str]:
    with pytest.raises(MCPError) as caught:
        await call
    message = caught.value.error.message
    return caught.value.error.code, message.replace(name, "<name>") if name else message


async def surface(client: Client, name: str) -> dict[str, Any]:
    """Everything a client can learn about a published name, in every primitive."""
    called = await client.call_tool(name, {"query": "x"}, raise_on_error=False)
    return {
        "listed": name in {t.name for t in await client.list_tools()},
        "call": (called.is_error, called.content[0].text.replace(name, "<name>")),
        "read": await error_of(client.read_resource(schema_uri(name)), name),
        "render": await error_of(client.get_prompt(name), name),
        "resources": schema_uri(name) in {str(r.uri) for r in await client.list_resources()},
        "prompts": name in {p.name for p in await client.list_prompts()},
        "completions": name in await complete_template(client, name[:3]),
        "argument": await complete(client, name, "sort"),
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", sorted(RETIRE))
async def test_a_retired_flow_is_gone_from_every_primitive_once_the_change_returns(
        mode: str, how: str) -> None:
    executor = build_catalogue()
    server = serving(executor)
    async with Client(server.fastmcp, mode=mode) as client:
        # Warm every cache first: lists, components, the whole catalogue.
        assert "product_search" in {t.name for t in await client.list_tools()}
        assert await complete(client, "product_search", "sort") == ["relevance", "price"]
        await client.read_resource(schema_uri("product_search"))
        RETIRE[how](executor.registry)
        gone = await surface(client, "product_search")
        never = await surface(client, NEVER)
    assert gone == never
    assert gone["listed"] is False and gone["call"] == (True, "Unknown tool: '<name>'")
    assert gone["read"] == (-32602, "Resource not found: 'chainweaver://flows/<name>/schema'")
    report = {entry.flow_name: entry for entry in server.exposure_report()}
    if how == "archive":
        assert "archived" in (report["product_search"].reason or "")
    else:
        assert "product_search" not in report


@pytest.mark.parametrize("mode", MODES)
async def test_new_versions_and_promotions_go_live(mode: str) -> None:
    executor = build_catalogue()
    server = serving(executor)
    async with Client(server.fastmcp, mode=mode) as client:
        before = {t.name: t for t in await client.list_tools()}
        assert before["order_status"].meta["chainweaver"]["version"] == "2.1.0"
        assert "draft_report" not in before
        current = executor.registry.get_flow("order_status")
        executor.registry.register_flow(dataclasses.replace(
            current, version="3.0.0", description="The third version."))
        executor.registry.set_lifecycle("draft_report", "reviewed")
        executor.registry.set_lifecycle("draft_report", "active")
        after = {t.name: t for t in await client.list_tools()}
        schema = await client.read_resource(schema_uri("order_status"))
        called = await client.call_tool("draft_report", {"query": "shoes"})
        prompts = {p.name for p in await client.list_prompts()}
    assert after["order_status"].meta["chainweaver"]["version"] == "3.0.0"
    assert after["order_status"].description == "The third version."
    assert '"version": "3.0.0"' in schema[0].text.replace('":"', '": "')
    assert not called.is_error
    assert {"draft_report", "draft_report__secret"} <= prompts


async def test_a_run_in_progress_finishes_after_its_flow_is_retired() -> None:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)

    @tool(safety=ToolSafetyContract("read"))
    def retire_myself(text: str) -> dict:
        """Archive the flow that is running this step."""
        registry.set_lifecycle("self_retiring", "archived")
        return {"text": text}

    executor.register_tool(retire_myself)
    registry.register_flow(Flow("self_retiring", "Retires itself.",
                                [FlowStep("retire_myself")]))
    server = FlowServer(executor)
    async with Client(server.fastmcp) as client:
        first = await client.call_tool("self_retiring", {"text": "x"})
        second = await client.call_tool("self_retiring", {"text": "x"}, raise_on_error=False)
    assert not first.is_error and first.content[0].text == '{"text": "x"}'
    assert second.is_error and second.content[0].text == "Unknown tool: 'self_retiring'"


def test_a_pinned_snapshot_answers_to_the_end_of_the_request() -> None:
    executor = build_catalogue()
    from chainweaver.mcp.gate.admission import admitted, pinned, pinned_snapshot

    live = LiveExposure(Exposure(executor, ExposurePolicy()), pinned=pinned_snapshot)
    request, other = object(), object()
    first = pinned(request, live)
    assert first is not None
    with admitted(first):
        snapshot = live.current
        executor.registry.set_lifecycle("product_search", "archived")
        live.swap(Exposure(executor, ExposurePolicy(), previous=live.latest))
        assert live.current is snapshot and live.tool("product_search") is not None
        assert pinned(request, live) is None  # the same request keeps its snapshot
        inheriting = pinned(other, live)  # a task of another request does not
        assert inheriting is not None
        with admitted(inheriting):
            assert live.current is live.latest and live.tool("product_search") is None
        assert live.current is snapshot
    assert live.current is live.latest is not snapshot
    assert live.tool("product_search") is None
    assert live.sequence == executor.registry.sequence


def test_unchanged_flows_keep_their_decision_across_snapshots() -> None:
    executor = build_catalogue()
    first = Exposure(executor, ExposurePolicy())
    kept = first.flow("order_status")
    executor.registry.set_lifecycle("product_search", "archived")
    second = Exposure(executor, ExposurePolicy(), previous=first)
    assert second.flow("order_status") is kept  # carried, not judged again
    assert second.flow("product_search") is None and first.flow("product_search")


async def test_a_change_the_server_cannot_publish_is_refused() -> None:
    executor = build_catalogue()
    executor.registry.register_flow(Flow(
        "shop", "Shop.", [FlowStep("search_products")],
        prompts=[FlowPrompt("find", messages=[PromptMessage("user", "Find.")])]))
    server = serving(executor)
    clash = Flow("shop__find", "Clashes with shop's prompt.", [FlowStep("search_products")])
    with pytest.raises(ExposureConfigError, match="collides"):
        executor.registry.register_flow(clash)
    assert "shop__find" not in executor.registry
    async with Client(server.fastmcp) as client:
        assert "shop__find" not in {t.name for t in await client.list_tools()}
    assert "shop__find" not in {e.flow_name for e in server.exposure_report()}


# ------------------------------------------------------------------ pagination


@pytest.mark.parametrize("mode", MODES)
async def test_a_cursor_belongs_to_the_snapshot_that_issued_it(mode: str) -> None:
    executor = build_catalogue()
    server = serving(executor, serving=ServingConfig(page_size=2))
    async with Client(server.fastmcp, mode=mode) as client:
        first = await client.list_tools_mcp()
        assert first.next_cursor is not None
        second = await client.list_tools_mcp(cursor=first.next_cursor)
        assert {t.name for t in first.tools}.isdisjoint(t.name for t in second.tools)
        executor.registry.set_lifecycle("product_search", "archived")
        stale = await error_of(client.list_tools_mcp(cursor=first.next_cursor))
        bad = await error_of(client.list_prompts_mcp(cursor="not-a-cursor"))
        # Listing again from the start works, on the new snapshot.
        names = [t.name for t in await client.list_tools()]
    assert stale == (-32602, LIST_AGAIN)
    assert bad == (-32602, "Invalid cursor")
    assert "product_search" not in names and len(names) == 3


# --------------------------------------------------------------- notifications


class Heard:
    """The notifications one client received, with when."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str]] = []

    async def __call__(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if method is not None:
            uri = getattr(getattr(message, "params", None), "uri", None)
            self.events.append((time.monotonic(), f"{method} {uri}" if uri else method))

    async def settle(self, expected: int, quiet: float = 0.3) -> list[str]:
        """Wait (bounded) for ``expected`` notifications, then ``quiet`` s for extras."""
        for _ in range(200):
            if len(self.events) >= expected:
                break
            await asyncio.sleep(0.025)
        await asyncio.sleep(quiet)
        return sorted(method for _, method in self.events)


TOOLS = "notifications/tools/list_changed"
RESOURCES = "notifications/resources/list_changed"
PROMPTS = "notifications/prompts/list_changed"
UPDATED = "notifications/resources/updated"


async def test_legacy_sessions_are_told_what_changed_and_only_that() -> None:
    executor = build_catalogue()
    server = serving(executor)
    heard = Heard()
    async with Client(server.fastmcp, mode="legacy", message_handler=heard) as client:
        await client.session.subscribe_resource(schema_uri("order_status"))
        await client.session.subscribe_resource(schema_uri("price_quote"))
        # A new version: same names, new contract. No resource list change.
        current = executor.registry.get_flow("order_status")
        executor.registry.register_flow(dataclasses.replace(current, version="3.0.0"))
        # (The index changed too, but this client did not subscribe to it.)
        assert await heard.settle(3) == sorted([
            TOOLS, PROMPTS, f"{UPDATED} {schema_uri('order_status')}"])
        heard.events.clear()
        # A change nobody can see: an excluded flow moves between excluded lifecycles.
        executor.registry.set_lifecycle("draft_report", "archived")
        assert await heard.settle(0) == []
        # A retirement: every list changes; unsubscribed, it sends no update.
        await client.session.unsubscribe_resource(schema_uri("price_quote"))
        executor.registry.unregister("price_quote")
        assert await heard.settle(3) == sorted([TOOLS, RESOURCES, PROMPTS])


async def test_a_burst_of_changes_is_one_notification() -> None:
    executor = build_catalogue()
    server = FlowServer(executor)  # tools only: no resource or prompt notices
    heard = Heard()
    async with Client(server.fastmcp, mode="legacy", message_handler=heard) as client:
        await client.list_tools()
        for index in range(20):
            executor.registry.register_flow(Flow(f"burst_{index}", "Burst.",
                                                 [FlowStep("search_products")]))
        assert await heard.settle(1) == [TOOLS]


async def test_listen_streams_get_the_events_they_asked_for() -> None:
    executor = build_catalogue()
    server = serving(executor)
    async with Client(server.fastmcp) as client, listen(
            client.session, tools_list_changed=True, prompts_list_changed=True,
            resource_subscriptions=[schema_uri("order_status")]) as stream:
        current = executor.registry.get_flow("order_status")
        executor.registry.register_flow(dataclasses.replace(current, version="3.0.0"))
        events = [await asyncio.wait_for(stream.__anext__(), 5) for _ in range(3)]
        executor.registry.set_lifecycle("product_search", "archived")
        events.append(await asyncio.wait_for(stream.__anext__(), 5))
    kinds = sorted(type(event).__name__ for event in events[:3])
    assert kinds == ["PromptsListChanged", "ResourceUpdated", "ToolsListChanged"]
    assert [e.uri for e in events[:3] if hasattr(e, "uri")] == [schema_uri("order_status")]
    # Resources list changes were not asked for: the next event is the tools list.
    assert type(events[3]).__name__ == "ToolsListChanged"


@pytest.mark.parametrize("mode", MODES)
async def test_capabilities_advertise_what_is_served(mode: str) -> None:
    async with Client(serving().fastmcp, mode=mode) as client:
        capabilities = client.server_capabilities
    async with Client(FlowServer(build_catalogue()).fastmcp, mode=mode) as client:
        tools_only = client.server_capabilities
    assert capabilities.tools.list_changed and capabilities.prompts.list_changed
    assert capabilities.resources.list_changed and capabilities.resources.subscribe
    assert tools_only.tools.list_changed
    if mode == "legacy":  # no schema resources: nothing to subscribe to
        assert tools_only.resources is None or not tools_only.resources.subscribe


async def test_subscribing_to_a_hidden_uri_says_nothing() -> None:
    server = serving()
    async with Client(server.fastmcp, mode="legacy") as client:
        hidden = await client.session.subscribe_resource(schema_uri("draft_report"))
        never = await client.session.subscribe_resource(schema_uri(NEVER))
    assert hidden == never == mcp_types.EmptyResult()


def test_a_server_that_is_gone_stops_following() -> None:
    executor = build_catalogue()
    server = serving(executor)
    server.close()
    executor.registry.set_lifecycle("product_search", "archived")
    # The snapshot in use stays.
    assert {e.flow_name: e for e in server.exposure_report()}["product_search"].exposed
    del server
    executor.registry.set_lifecycle("price_quote", "archived")  # no server to follow


async def test_the_fastmcp_seams_still_exist() -> None:
    # chainweaver.mcp.fastmcp_seams reaches FastMCP's low-level server and the SDK
    # session's connection through private attributes: this fails loudly when they move.
    server = FastMCP("seam")
    low = low_level_server(server)
    assert low.get_request_handler("tools/list") is not None
    assert callable(low.add_request_handler)
    closed: list[bool] = []

    @server.tool
    def probe() -> str:
        """Register a callback on this request's connection."""
        session = get_context().request_context.session
        return str(on_connection_close(session, lambda: closed.append(True)))

    async with Client(server, mode="legacy") as client:
        assert (await client.call_tool("probe")).content[0].text == "True"
        assert closed == []
    assert closed == [True]

    def lookup(name: str) -> None:
        return None

    install_input_schema_lookup(server, lookup)
    assert low.get_tool_input_schema is lookup
    assert on_connection_close(object(), lambda: None) is False
    forget_request_handler(server, "tools/list")
    assert low.get_request_handler("tools/list") is None


async def test_sessions_that_went_away_are_forgotten() -> None:
    executor = build_catalogue()
    server = FlowServer(executor)
    notifier = server._notifier  # how many sessions it keeps is not public API
    async with Client(server.fastmcp, mode="legacy") as kept:
        await kept.list_tools()
        for _ in range(3):
            async with Client(server.fastmcp, mode="legacy") as gone:
                await gone.list_tools()
                assert notifier.listeners == 2
        assert notifier.listeners == 1  # each forgotten when its connection ended
        notifier.max_sessions = 1
        async with Client(server.fastmcp, mode="legacy") as newer:
            await newer.list_tools()
            assert notifier.listeners == 1  # capped: the least recent is dropped
    assert notifier.listeners == 0


def test_a_server_reports_flows_whose_file_edit_is_not_served(tmp_path: Any) -> None:
    from chainweaver.files import load_flows_by_file
    from chainweaver.watch import FlowFileWatcher

    executor = build_catalogue()
    path = tmp_path / "late.flow.json"
    path.write_text('{"name": "late", "description": "Late.", '
                    '"steps": [{"tool": "search_products"}]}')
    loaded = load_flows_by_file(path, tools=executor.tools)
    executor.registry.register_flow(loaded[path])
    server = FlowServer(executor)
    with pytest.raises(ExposureConfigError, match="this server's registry"):
        server.watch(FlowFileWatcher(FlowRegistry(), path))
    watcher = FlowFileWatcher(executor.registry, path, tools=executor.tools,
                              interval=3600, loaded=loaded)
    server.watch(watcher)
    try:
        path.write_text('{"name": "late", broken')
        assert watcher.check() is False
        report = {entry.flow_name: entry for entry in server.exposure_report()}
        assert "invalid JSON" in (report["late"].stale or "")
        assert report["late"].to_dict()["stale"] == report["late"].stale
        assert report["order_status"].stale is None
    finally:
        server.close()


def test_a_patched_catalogue_equals_one_decided_afresh() -> None:
    executor = build_catalogue()
    registry = executor.registry
    registry.register_flow(Flow("wrapper", "Runs product_search.",
                                [FlowStep(flow="product_search")]))
    options: dict[str, Any] = {"expose_schemas": True, "expose_prompts": True}
    snapshot = Exposure(executor, ExposurePolicy(), **options)
    snapshot.catalogue  # noqa: B018 - the base the next snapshot patches
    changes: list[Callable[[], Any]] = [
        lambda: registry.set_lifecycle("product_search", "archived"),  # wrapper follows
        lambda: registry.unregister("price_quote"),
        lambda: registry.register_flow(Flow("price_quote", "Back.", [FlowStep("quote_price")])),
        lambda: registry.set_lifecycle("draft_report", "reviewed"),
        lambda: registry.set_lifecycle("draft_report", "active"),
        lambda: registry.register_flow(dataclasses.replace(
            registry.get_flow("order_status"), version="9.0.0")),
        lambda: registry.unregister("order_status", "9.0.0"),
    ]
    for change in changes:
        change()
        snapshot = Exposure(executor, ExposurePolicy(), previous=snapshot, **options)
        patched = snapshot.catalogue
        fresh = Exposure(executor, ExposurePolicy(), **options).catalogue
        assert patched.report == fresh.report
        for kind in ("tools", "resources"):
            assert {k: v.flow for k, v in getattr(patched, kind).items()} == \
                {k: v.flow for k, v in getattr(fresh, kind).items()}
        assert {k: (v.exposed_flow and v.exposed_flow.flow, v.prompt)
                for k, v in patched.prompts.items()} == \
            {k: (v.exposed_flow and v.exposed_flow.flow, v.prompt)
             for k, v in fresh.prompts.items()}
    assert "wrapper" not in snapshot.tools and "draft_report" in snapshot.tools


async def test_a_server_kept_only_through_its_fastmcp_still_follows() -> None:
    executor = build_catalogue()
    served = FlowServer(executor).fastmcp  # the FlowServer itself is dropped
    gc.collect()
    executor.registry.set_lifecycle("product_search", "archived")
    async with Client(served) as client:
        assert "product_search" not in {t.name for t in await client.list_tools()}


async def test_components_of_retired_flows_are_forgotten() -> None:
    executor = build_catalogue()
    server = serving(executor)
    provider = server._provider  # how many components it keeps is not public API
    async with Client(server.fastmcp) as client:
        await client.list_tools()
        await client.list_resources()
        await client.list_prompts()
        built = provider.components_built
        retired = server.exposure_report()
        names = {e.flow_name: e for e in retired}["product_search"]
        # Its tool, its schema resource, its invocation and authored prompts.
        own = 2 + len(names.prompt_names)
        executor.registry.unregister("product_search")
        for _ in range(200):  # bounded: the notifier rebuilds, then the cache shrinks
            if provider.components_built < built:
                break
            await asyncio.sleep(0.025)
        assert own == 5 and provider.components_built == built - own
        assert "order_status" in {t.name for t in await client.list_tools()}
        assert provider.components_built == built - own  # the others stayed cached
