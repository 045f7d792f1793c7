"""Change notifications reach the clients of a parent a FlowServer is mounted into with
``mount_into``, in memory, on both protocol eras (2025-11-25 ``resources/subscribe``,
2026-07-28 ``subscriptions/listen`` on the parent): named as the parent lists them
(the mount's namespace, then the parent's transforms), each caller told only of flows
and runs in its own view, a withdrawn flow's URI never named, and the subscription
requests gated, capped and audited by the mounted server's gate as when it stands
alone (over HTTP: tests/e2e/test_notifications_mounted_http.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import mcp_types
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.transforms import Namespace
from mcp import MCPError
from mcp.client.subscriptions import listen
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.catalogue import READ, build_catalogue
from support.notices import PROMPTS, RESOURCES, TOOLS, UPDATED, Heard, listening

from chainweaver import Flow, FlowExecutor, FlowGovernance, FlowStep, tool
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    RunHistory,
    SecurityConfig,
    ServingConfig,
    fastmcp_seams,
    visible_claim,
)

pytestmark = [pytest.mark.anyio,
              # 2025-11-25 clients subscribe the old way, on purpose.
              pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")]

MODES = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
# Both see price_quote (pricing-team); otherwise their views are disjoint.
TEAMS = {"sam": ["search-team", "pricing-team"], "olga": ["orders-team", "pricing-team"]}
QUICK = ServingConfig(change_debounce=0.01)
HOLD: dict[str, asyncio.Event] = {}


@tool(safety=READ)
async def held_quote(sku: str) -> dict:
    """Quote a price once the test lets it."""
    if "open" in HOLD:
        await HOLD["open"].wait()
    return {"sku": sku, "cents": 100}


def catalogue() -> FlowExecutor:
    executor = build_catalogue()
    executor.register_tool(held_quote)
    executor.registry.register_flow(Flow(
        "held_quote", "Quote a price, slowly.", [FlowStep("held_quote")],
        governance=FlowGovernance(owner="pricing-team")))
    return executor


class Switch:
    """An authenticator whose caller the test switches before each client's requests
    (in memory there are no headers to tell callers apart); a request context asked
    about again names the caller it named then, as its credentials would."""

    def __init__(self) -> None:
        self.who: str | None = None
        self.asked: list[tuple[GateContext, str | None]] = []

    def __call__(self, ctx: GateContext) -> CallerIdentity | None:
        who = next((who for seen, who in self.asked if seen is ctx), None)
        if who is None:
            who = self.who
            self.asked.append((ctx, who))
        return None if who is None else CallerIdentity(who, {"teams": TEAMS[who]},
                                                       subject=who)


@dataclasses.dataclass
class Mounted:
    executor: FlowExecutor
    server: FlowServer
    parent: FastMCP
    switch: Switch
    events: list[AuditEvent]


def mounted(parent: FastMCP | None = None, namespace: str = "shop",
            meter_provider: Any = None, **security: Any) -> Mounted:
    """A FlowServer with per-team views mounted into ``parent`` (a plain FastMCP)."""
    events: list[AuditEvent] = []
    switch = Switch()
    executor = catalogue()
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        run_history=RunHistory(), serving=QUICK,
                        meter_provider=meter_provider,
                        security=SecurityConfig(authenticator=switch,
                                                audit_hook=events.append,
                                                visible=visible_claim("teams"),
                                                **security))
    parent = parent or FastMCP("gateway")
    server.mount_into(parent, namespace=namespace)
    return Mounted(executor, server, parent, switch, events)


def schema(name: str, root: str = "chainweaver://shop") -> str:
    return f"{root}/flows/{name}/schema"


def updated(*uris: str) -> list[str]:
    return [f"{UPDATED} {uri}" for uri in uris]


def new_version(executor: FlowExecutor, name: str) -> None:
    current = executor.registry.get_flow(name)
    major = int(current.version.split(".")[0]) + 1
    executor.registry.register_flow(dataclasses.replace(current, version=f"{major}.0.0"))


@asynccontextmanager
async def follower(parent: FastMCP, mode: str, uris: list[str], switch: Switch | None = None,
                   who: str | None = None) -> AsyncIterator[tuple[Client, Heard]]:
    """A client of the parent (as caller ``who``) that follows changes: subscribed to
    ``uris`` on a 2025-11-25 session, or a 2026-07-28 listen stream on the parent."""
    heard = Heard()
    if switch is not None:
        switch.who = who
    if mode == "legacy":
        async with Client(parent, mode=mode, message_handler=heard) as client:
            for uri in uris:  # gated: the session is admitted as ``who``
                await client.session.subscribe_resource(uri)
            yield client, heard
        return
    async with Client(parent) as client, listening(client.session, heard, uris):
        yield client, heard


async def updates(heard: Heard, expected: int) -> list[str]:
    """The resource updates among what ``heard`` is told (a 2025-11-25 caller of a
    tool is also sent its progress)."""
    return [notice for notice in await heard.take(expected, quiet=0.15)
            if notice.startswith(UPDATED)]


async def told_of(heard: Heard, notice: str) -> list[str]:
    """The resource updates ``heard`` is told, once (bounded) ``notice`` is among them."""
    for _ in range(400):
        if notice in heard.told:
            break
        await asyncio.sleep(0.025)
    return await updates(heard, 0)


@pytest.mark.parametrize("mode", MODES)
async def test_each_parent_client_hears_only_of_its_own_view_and_runs(mode: str) -> None:
    shop = mounted()
    index, runs = "chainweaver://shop/flows", "chainweaver://shop/runs"
    uris = [schema("product_search"), schema("order_status"), index, runs]
    async with follower(shop.parent, mode, uris, shop.switch, "sam") as (_, sam), \
            follower(shop.parent, mode, uris, shop.switch, "olga") as (olga_client, olga):
        new_version(shop.executor, "product_search")  # in sam's view only
        assert await sam.take(4, quiet=0.15) == sorted(
            [TOOLS, PROMPTS, *updated(schema("product_search"), index)])
        assert await olga.take(0, quiet=0.15) == []
        new_version(shop.executor, "order_status")  # in olga's view only
        assert await olga.take(4, quiet=0.15) == sorted(
            [TOOLS, PROMPTS, *updated(schema("order_status"), index)])
        assert await sam.take(0, quiet=0.15) == []
        # Olga's run of a flow both see: her listing is updated; sam, subscribed to the
        # same URI, hears nothing of it.
        shop.switch.who = "olga"
        await olga_client.call_tool("shop_price_quote", {"sku": "SKU-1"})
        assert set(await told_of(olga, f"{UPDATED} {runs}")) == {f"{UPDATED} {runs}"}
        assert await sam.take(0, quiet=0.15) == []
    # The mounted server's gate admitted each subscription request, as its caller.
    method = "resources/subscribe" if mode == "legacy" else "subscriptions/listen"
    admitted = {(e.caller_id, e.decision) for e in shop.events
                if e.kind == "subscription" and e.name == method}
    assert admitted == {("sam", "allowed"), ("olga", "allowed")}


@pytest.mark.parametrize("mode", MODES)
async def test_a_withdrawn_flow_is_never_named_to_the_parents_clients(mode: str) -> None:
    shop = mounted()
    index, runs = "chainweaver://shop/flows", "chainweaver://shop/runs"
    HOLD["open"] = asyncio.Event()
    try:
        async with follower(shop.parent, mode, [schema("held_quote"), index, runs],
                            shop.switch, "olga") as (client, olga):
            call = asyncio.create_task(client.call_tool("shop_held_quote", {"sku": "A"}))
            assert await told_of(olga, f"{UPDATED} {runs}") == [f"{UPDATED} {runs}"]  # it runs
            shop.executor.registry.set_lifecycle("held_quote", "archived")
            # Its tool, schema and prompt are gone (the index changed with them), and
            # its schema URI is not named.
            assert await olga.take(4, quiet=0.15) == sorted(
                [TOOLS, RESOURCES, PROMPTS, f"{UPDATED} {index}"])
            HOLD["open"].set()
            assert not (await call).is_error
            # Its run ended, outside the view: nothing is said of it.
            assert await updates(olga, 0) == []
    finally:
        HOLD.clear()


async def test_the_parents_subscription_requests_pass_the_mounted_gate() -> None:
    reader = InMemoryMetricReader()
    shop = mounted(meter_provider=MeterProvider(metric_readers=[reader]),
                   max_listen_streams_per_caller=1)
    notifier = shop.server._notifier
    async with AsyncExitStack() as stack:
        shop.switch.who = None  # the authenticator refuses
        nobody = await stack.enter_async_context(Client(shop.parent))
        with pytest.raises(MCPError) as refused:
            await stack.enter_async_context(listen(nobody.session, tools_list_changed=True))
        assert refused.value.error.code == GATE_REFUSED
        legacy = await stack.enter_async_context(Client(shop.parent, mode="legacy"))
        with pytest.raises(MCPError) as refused:
            await legacy.session.subscribe_resource(schema("order_status"))
        assert refused.value.error.code == GATE_REFUSED
        shop.switch.who = "sam"
        sam = await stack.enter_async_context(Client(shop.parent))
        await stack.enter_async_context(listen(sam.session, tools_list_changed=True))
        with pytest.raises(MCPError) as refused:  # over the mounted server's cap
            await stack.enter_async_context(listen(sam.session, tools_list_changed=True))
        assert refused.value.error.model_dump(exclude_none=True) == {
            "code": GATE_REFUSED, "message": "Request refused: too_many_listen_streams",
            "data": {"reason": "too_many_listen_streams"}}
        assert notifier.listeners == 2  # the 2025-11-25 session, and sam's one stream
    # Audited as a direct listen is: the cap's refusal where the stream was to open.
    assert [(e.name, e.phase, e.caller_id, e.decision, e.reason) for e in shop.events
            if e.kind == "subscription"] == [
        ("subscriptions/listen", "decision", None, "denied", "unauthenticated"),
        ("resources/subscribe", "decision", None, "denied", "unauthenticated"),
        ("subscriptions/listen", "decision", "sam", "allowed", "ok"),
        ("subscriptions/listen", "decision", "sam", "allowed", "ok"),
        ("subscriptions/listen", "completed", "sam", "denied", "too_many_listen_streams"),
        ("subscriptions/listen", "completed", "sam", "allowed", "ok")]  # sam's stream ends
    # And counted by the mounted server, as its own requests are.
    data = reader.get_metrics_data()
    counted = {(point.attributes["name"], point.attributes["outcome"]): point.value
               for resource in (data.resource_metrics if data else ())
               for scope in resource.scope_metrics for metric in scope.metrics
               if metric.name == "chainweaver.requests"
               for point in metric.data.data_points
               if point.attributes["kind"] == "subscription"}
    assert counted == {("subscriptions/listen", "refused"): 2,
                       ("subscriptions/listen", "cancelled"): 1,  # its client left
                       ("resources/subscribe", "refused"): 1}


@pytest.mark.parametrize("mode", MODES)
async def test_two_mounted_servers_are_each_named_as_the_parent_lists_them(
        mode: str) -> None:
    parent = FastMCP("gateway")
    shop, ops = mounted(parent, "shop"), mounted(parent, "ops")
    parent.add_transform(Namespace("gw"))  # after mounting: it still names them
    shop.switch.who = ops.switch.who = "olga"
    listed = {str(resource.uri) for resource in await _resources(parent)}
    uris = [schema("order_status", "chainweaver://gw/shop"),
            schema("order_status", "chainweaver://gw/ops")]
    assert set(uris) <= listed
    async with follower(parent, mode, uris, shop.switch, "olga") as (_, heard):
        ops.switch.who = "olga"
        new_version(shop.executor, "order_status")
        assert await updates(heard, 3) == updated(uris[0])
        new_version(ops.executor, "order_status")
        assert await updates(heard, 3) == updated(uris[1])


@pytest.mark.parametrize("mode", MODES)
async def test_a_flowserver_parent_tells_its_own_changes_and_its_mounted_ones(
        mode: str) -> None:
    executor = catalogue()
    outer = FlowServer(executor, expose_schemas=True, serving=QUICK)
    shop = mounted(outer.fastmcp)
    own, inner = "chainweaver://flows/order_status/schema", schema("order_status")
    async with follower(outer.fastmcp, mode, [own, inner], shop.switch, "olga") as (_, heard):
        new_version(executor, "order_status")
        assert await heard.take(2, quiet=0.15) == sorted([TOOLS, *updated(own)])
        new_version(shop.executor, "order_status")
        assert await heard.take(3, quiet=0.15) == sorted([TOOLS, PROMPTS, *updated(inner)])


async def _resources(parent: FastMCP) -> list[Any]:
    async with Client(parent) as client:
        return await client.list_resources()


async def test_a_parent_serving_its_own_listen_streams_keeps_them(
        caplog: pytest.LogCaptureFixture) -> None:
    parent = FastMCP("gateway")

    async def its_own(ctx: Any, params: Any) -> Any:
        raise MCPError(code=-32000, message="the parent's own listen handler")

    fastmcp_seams.low_level_server(parent).add_request_handler(
        "subscriptions/listen", mcp_types.SubscriptionsListenRequestParams, its_own)
    with caplog.at_level("WARNING", logger="chainweaver.mcp.live.subscriptions"):
        shop = mounted(parent)
    assert any("serves subscriptions/listen with a handler of its own" in record.message
               for record in caplog.records)
    shop.switch.who = "olga"
    async with Client(parent) as client:
        with pytest.raises(MCPError, match="the parent's own listen handler"):
            async with listen(client.session, tools_list_changed=True):
                pass
        # Everything else of the mounted server is served as before.
        assert not (await client.call_tool("shop_price_quote", {"sku": "S"})).is_error


@pytest.mark.parametrize("mode", MODES)
async def test_the_parent_advertises_the_subscriptions_it_now_serves(mode: str) -> None:
    shop = mounted()
    shop.switch.who = "olga"
    async with Client(shop.parent, mode=mode) as client:
        capabilities = client.server_capabilities
    assert capabilities is not None and capabilities.resources is not None
    assert capabilities.resources.subscribe is True
    assert capabilities.tools is not None and capabilities.tools.list_changed is True
    assert capabilities.prompts is not None and capabilities.prompts.list_changed is True


async def test_a_legacy_client_of_the_parent_unsubscribes() -> None:
    shop = mounted()
    uri = schema("order_status")
    async with follower(shop.parent, "legacy", [uri], shop.switch, "olga") as (client, olga):
        await client.session.unsubscribe_resource(uri)
        new_version(shop.executor, "order_status")
        assert await olga.take(2, quiet=0.15) == sorted([TOOLS, PROMPTS])  # no update


async def test_a_session_keeps_its_caller_when_another_mounted_gate_admits_it() -> None:
    # Two FlowServers in one parent: "shop" asks an authenticator, "desk" follows the
    # bearer token (no authenticator; an audit hook keeps its gate in the chain). A
    # request both gates admit (a list) must leave shop's record of the session on
    # the caller shop's authenticator named: desk's admission is not shop's to learn.
    shop = mounted()
    desk = FlowServer(catalogue(), expose_schemas=True, serving=QUICK,
                      security=SecurityConfig(audit_hook=lambda event: None))
    desk.mount_into(shop.parent, namespace="desk")
    runs = "chainweaver://shop/runs"
    HOLD["open"] = asyncio.Event()
    try:
        async with follower(shop.parent, "legacy", [runs], shop.switch,
                            "olga") as (client, olga):
            call = asyncio.create_task(client.call_tool("shop_held_quote", {"sku": "A"}))
            assert await told_of(olga, f"{UPDATED} {runs}") == [f"{UPDATED} {runs}"]
            await client.list_tools()  # admitted by shop's gate, then by desk's
            HOLD["open"].set()
            assert not (await call).is_error
            # Olga's run ended: she is told, as the caller shop admitted her as.
            assert await told_of(olga, f"{UPDATED} {runs}") == [f"{UPDATED} {runs}"]
    finally:
        HOLD.clear()
