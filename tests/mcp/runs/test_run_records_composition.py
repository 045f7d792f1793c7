"""Run records pass the same admission under every supported composition (issue 32,
item 6), through a real in-memory client on both eras.

A FlowServer with a run history is served standing alone, behind FastMCP's
``Namespace`` transform, and mounted with ``mount_into`` (into a plain FastMCP parent
and into another FlowServer, with and without a namespace, with a namespace on the
parent too). Under each, a run read is authenticated (no caller: -32001), counted
under the runs budget ``chainweaver://runs``, authorized with the run's flow and
audited, exactly as standing alone; another caller's run id answers exactly like an id
that never existed; and a large output's ``resource_link`` (and
``_meta.chainweaver.output.uri``) is the URI as the client addresses it there,
readable as written.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.transforms import Namespace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import BaseModel
from support.views import answer, renamed

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
)
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.body_cap import MESSAGE_BUDGET

pytestmark = pytest.mark.anyio
MODES = ["auto", "legacy"]  # 2026-07-28, 2025-11-25
NEVER_ID = "0" * 24
LIMIT = 2_000  # bytes: the large flow's output goes as a link, the small one's whole


class Size(BaseModel):
    n: int


@tool(safety=ToolSafetyContract("read"))
def padded(size: Size) -> dict:
    return {"data": "x" * size.n}


def catalogue(prefix: str = "") -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(padded)
    for name in ("small", "large"):
        executor.registry.register_flow(Flow(f"{prefix}{name}", f"The {name} flow.",
                                             [FlowStep("padded")]))
    return executor


class Hooks:
    """Every hook of the gate, remembering what each was asked: the test says who
    calls (``who=None``: nobody is authenticated)."""

    def __init__(self) -> None:
        self.who: str | None = "alice"
        self.events: list[AuditEvent] = []
        self.budgets: list[tuple[str, str]] = []
        self.authorized: list[tuple[str, str | None]] = []

    def authenticate(self, ctx: GateContext) -> CallerIdentity | None:
        return CallerIdentity(self.who, subject=self.who) if self.who else None

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        self.budgets.append((caller.id, name))
        return True

    def authorize(self, ctx: GateContext) -> bool:
        self.authorized.append((ctx.name, ctx.flow_name))
        return True

    def security(self) -> SecurityConfig:
        return SecurityConfig(authenticator=self.authenticate, rate_limiter=self,
                              authorizer=self.authorize, audit_hook=self.events.append)

    def clear(self) -> None:
        self.events.clear()
        self.budgets.clear()
        self.authorized.clear()


def flow_server(security: SecurityConfig | None = None, prefix: str = "",
                meter_provider: MeterProvider | None = None) -> FlowServer:
    return FlowServer(catalogue(prefix), security=security or SecurityConfig(),
                      run_history=RunHistory(output_limit=LIMIT), meter_provider=meter_provider)


@dataclass
class Served:
    """What a client connects to, and how it names the flows and run URIs there."""

    target: FastMCP
    tool_prefix: str  # before every tool name
    runs: str  # where the client reaches chainweaver://runs


def standalone(server: FlowServer) -> Served:
    return Served(server.fastmcp, "", "chainweaver://runs")


def namespaced(server: FlowServer) -> Served:
    server.fastmcp.add_transform(Namespace("shop"))
    return Served(server.fastmcp, "shop_", "chainweaver://shop/runs")


def mounted(server: FlowServer) -> Served:
    parent = FastMCP("gateway")
    server.mount_into(parent)
    return Served(parent, "", "chainweaver://runs")


def mounted_with_namespace(server: FlowServer) -> Served:
    parent = FastMCP("gateway")
    server.mount_into(parent, namespace="shop")
    return Served(parent, "shop_", "chainweaver://shop/runs")


def mounted_into_a_flow_server(server: FlowServer) -> Served:
    parent = FlowServer(catalogue(), security=SecurityConfig(audit_hook=lambda e: None))
    server.mount_into(parent.fastmcp, namespace="shop")
    return Served(parent.fastmcp, "shop_", "chainweaver://shop/runs")


def mounted_into_a_hookless_flow_server(server: FlowServer) -> Served:
    parent = FlowServer(catalogue())
    server.mount_into(parent.fastmcp, namespace="shop")
    return Served(parent.fastmcp, "shop_", "chainweaver://shop/runs")


def mounted_under_a_parent_namespace(server: FlowServer) -> Served:
    parent = FastMCP("gateway")
    server.mount_into(parent, namespace="shop")
    parent.add_transform(Namespace("gw"))
    return Served(parent, "gw_shop_", "chainweaver://gw/shop/runs")


def namespaced_and_mounted(server: FlowServer) -> Served:
    server.fastmcp.add_transform(Namespace("inner"))
    parent = FastMCP("gateway")
    server.mount_into(parent, namespace="shop")
    return Served(parent, "shop_inner_", "chainweaver://shop/inner/runs")


def mounted_before_another(server: FlowServer) -> Served:
    # The other's gate (hooks, no authenticator: it follows the token) sees every
    # request after this one's: it must never lend this server's runs its caller.
    parent = FastMCP("gateway")
    server.mount_into(parent, namespace="shop")
    other = FlowServer(catalogue("other_"), run_history=RunHistory(),
                       security=SecurityConfig(audit_hook=lambda e: None))
    other.mount_into(parent, namespace="desk")
    return Served(parent, "shop_", "chainweaver://shop/runs")


def parent_of_another(server: FlowServer) -> Served:
    # A FlowServer served with another mounted into it: its own flows' runs pass the
    # mounted one's gate too.
    other = FlowServer(catalogue("other_"), run_history=RunHistory(),
                       security=SecurityConfig(audit_hook=lambda e: None))
    other.mount_into(server.fastmcp, namespace="desk")
    return Served(server.fastmcp, "", "chainweaver://runs")


COMPOSITIONS: list[Callable[[FlowServer], Served]] = [
    standalone, namespaced, mounted, mounted_with_namespace, mounted_into_a_flow_server,
    mounted_into_a_hookless_flow_server, mounted_under_a_parent_namespace,
    namespaced_and_mounted, mounted_before_another, parent_of_another]


def composed(compose: Callable[[FlowServer], Served]) -> tuple[Hooks, Served]:
    hooks = Hooks()
    return hooks, compose(flow_server(hooks.security()))


async def run_flow(client: Client, served: Served, flow: str, n: int
                   ) -> mcp_types.CallToolResult:
    return await client.session.call_tool(f"{served.tool_prefix}{flow}", {"n": n})


def reads(hooks: Hooks) -> list[AuditEvent]:
    return [e for e in hooks.events if e.kind == "resource"]


def shape(event: AuditEvent) -> dict[str, Any]:
    fields = dict(vars(event))
    for varying in ("timestamp", "duration_ms", "result_sha256", "result_length"):
        fields[varying] = fields[varying] is not None
    return fields


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compose", COMPOSITIONS)
async def test_a_run_read_is_admitted_like_a_standalone_servers(
        mode: str, compose: Callable[[FlowServer], Served]) -> None:
    hooks, served = composed(compose)
    async with Client(served.target, mode=mode) as client:
        result = await run_flow(client, served, "small", 10)
        run_id = result.meta["chainweaver"]["run_id"]
        uri = f"{served.runs}/{run_id}"
        hooks.clear()
        record = json.loads((await client.read_resource(uri))[0].text)
        assert record["run_id"] == run_id and record["flow"] == "small"
        # Authorized with the run's flow, counted under the runs budget, audited.
        assert hooks.authorized == [(uri, "small")]
        assert hooks.budgets == [("alice", "chainweaver://runs")]
        assert [(e.name, e.flow_name, e.decision, e.phase) for e in reads(hooks)] == [
            (uri, "small", "allowed", "decision"), (uri, "small", "allowed", "completed")]
        listing = json.loads((await client.read_resource(served.runs))[0].text)
        assert [run["run_id"] for run in listing["runs"]] == [run_id]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compose", COMPOSITIONS)
async def test_another_callers_run_answers_like_one_that_never_existed(
        mode: str, compose: Callable[[FlowServer], Served]) -> None:
    hooks, served = composed(compose)
    async with Client(served.target, mode=mode) as client:
        result = await run_flow(client, served, "large", 3 * LIMIT)
        run_id = result.meta["chainweaver"]["run_id"]
        hooks.who = "bob"
        seen: dict[str, Any] = {}
        for name in (run_id, NEVER_ID):
            for path in ("", "/output"):
                hooks.clear()
                uri = f"{served.runs}/{name}{path}"
                got = await answer(lambda u=uri: client.session.read_resource(u))
                seen[f"{name}{path}"] = renamed(
                    [got, [shape(e) for e in hooks.events], hooks.budgets,
                     hooks.authorized], run_id, NEVER_ID)
    for path in ("", "/output"):
        assert seen[f"{run_id}{path}"] == seen[f"{NEVER_ID}{path}"]
        got, events, budgets, authorized = seen[f"{NEVER_ID}{path}"]
        assert "error" in got and got["error"]["code"] != GATE_REFUSED
        assert budgets == [["bob", "chainweaver://runs"]]
        assert [(e["decision"], e["flow_name"]) for e in events] == [
            ("allowed", None), ("allowed", None)]
        assert authorized == [[f"{served.runs}/{NEVER_ID}{path}", None]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compose", COMPOSITIONS)
async def test_an_unauthenticated_run_read_is_refused_by_the_gate(
        mode: str, compose: Callable[[FlowServer], Served]) -> None:
    hooks, served = composed(compose)
    async with Client(served.target, mode=mode) as client:
        result = await run_flow(client, served, "small", 10)
        run_id = result.meta["chainweaver"]["run_id"]
        hooks.who = None
        hooks.clear()
        for uri in (served.runs, f"{served.runs}/{run_id}", f"{served.runs}/{NEVER_ID}",
                    f"{served.runs}/{run_id}/output?offset=0"):
            got = await answer(lambda u=uri: client.session.read_resource(u))
            assert got == {"error": {"code": GATE_REFUSED,
                                     "message": "Request refused: unauthenticated",
                                     "data": {"reason": "unauthenticated"}}}, uri
    assert [(e.decision, e.reason) for e in reads(hooks)] == \
        [("denied", "unauthenticated")] * 4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compose", COMPOSITIONS)
async def test_a_large_outputs_link_is_the_uri_the_client_reads_it_by(
        mode: str, compose: Callable[[FlowServer], Served]) -> None:
    hooks, served = composed(compose)
    async with Client(served.target, mode=mode) as client:
        result = await run_flow(client, served, "large", 3 * LIMIT)
        run_id = result.meta["chainweaver"]["run_id"]
        links = [block for block in result.content if block.type == "resource_link"]
        expected = f"{served.runs}/{run_id}/output"
        assert [str(link.uri) for link in links] == [expected]
        assert result.meta["chainweaver"]["output"]["uri"] == expected
        assert expected in result.content[0].text  # the text names it too
        audited = [e for e in hooks.events if e.kind == "tool" and e.phase == "completed"]
        hooks.clear()
        whole = (await client.read_resource(expected))[0].text
        ranged = (await client.read_resource(f"{expected}?offset=0&length=100"))[0]
    assert hashlib.sha256(whole.encode()).hexdigest() == audited[-1].result_sha256
    assert ranged.blob is not None
    assert hooks.authorized == [(expected, "large"),
                                (f"{expected}?offset=0&length=100", "large")]
    assert hooks.budgets == [("alice", "chainweaver://runs")] * 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compose", COMPOSITIONS)
async def test_without_hooks_a_link_reads_as_written(
        mode: str, compose: Callable[[FlowServer], Served]) -> None:
    served = compose(flow_server())
    async with Client(served.target, mode=mode) as client:
        result = await run_flow(client, served, "large", 3 * LIMIT)
        link = [block for block in result.content if block.type == "resource_link"][0]
        run_id = result.meta["chainweaver"]["run_id"]
        assert str(link.uri) == f"{served.runs}/{run_id}/output"
        whole = (await client.read_resource(str(link.uri)))[0].text
        record = json.loads((await client.read_resource(f"{served.runs}/{run_id}"))[0].text)
    assert json.loads(whole) == {"data": "x" * 3 * LIMIT}
    assert record["output_sha256"] == hashlib.sha256(whole.encode()).hexdigest()


@pytest.mark.parametrize("compose", COMPOSITIONS)
async def test_run_reads_are_counted_under_the_runs_budget_name(
        compose: Callable[[FlowServer], Served]) -> None:
    hooks, reader = Hooks(), InMemoryMetricReader()
    served = compose(flow_server(hooks.security(),
                                 meter_provider=MeterProvider(metric_readers=[reader])))
    async with Client(served.target) as client:
        run_id = (await run_flow(client, served, "small", 10)).meta["chainweaver"]["run_id"]
        await client.read_resource(f"{served.runs}/{run_id}")
        await answer(lambda: client.session.read_resource(f"{served.runs}/{NEVER_ID}"))
        hooks.who = None
        await answer(lambda: client.session.read_resource(f"{served.runs}/{run_id}"))
    data = reader.get_metrics_data()
    reads = {(point.attributes["outcome"], point.attributes["name"]): point.value
             for resource in data.resource_metrics for scope in resource.scope_metrics
             for metric in scope.metrics if metric.name == "chainweaver.requests"
             for point in metric.data.data_points
             if point.attributes["kind"] == "resource"}
    assert reads == {("ok", "chainweaver://runs"): 1, ("not_found", "chainweaver://runs"): 1,
                     ("refused", "chainweaver://runs"): 1}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("namespace", [None, "two"])
async def test_two_servers_in_one_parent_each_admit_their_own_runs(
        mode: str, namespace: str | None) -> None:
    first_hooks, second_hooks = Hooks(), Hooks()
    first = flow_server(first_hooks.security())
    second = flow_server(second_hooks.security(), prefix="other_")
    parent = FastMCP("gateway")
    first.mount_into(parent)
    second.mount_into(parent, namespace=namespace)
    tool = f"{namespace}_other_large" if namespace else "other_large"
    second_runs = f"chainweaver://{namespace}/runs" if namespace else "chainweaver://runs"
    async with Client(parent, mode=mode) as client:
        one = (await client.session.call_tool("large", {"n": 3 * LIMIT})).meta
        two = (await client.session.call_tool(tool, {"n": 3 * LIMIT})).meta
        first_hooks.clear()
        second_hooks.clear()
        for meta in (one, two):
            await client.read_resource(meta["chainweaver"]["output"]["uri"])
    assert one["chainweaver"]["output"]["uri"].startswith("chainweaver://runs/")
    assert two["chainweaver"]["output"]["uri"].startswith(f"{second_runs}/")
    # Each run read is admitted by the server keeping the run, and by it alone.
    assert first_hooks.authorized == [(one["chainweaver"]["output"]["uri"], "large")]
    assert second_hooks.authorized == [(two["chainweaver"]["output"]["uri"],
                                        "other_large")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compose", [namespaced, mounted_with_namespace])
async def test_without_a_history_an_output_too_large_to_send_links_where_it_reads(
        mode: str, compose: Callable[[FlowServer], Served]) -> None:
    served = compose(FlowServer(catalogue()))  # outputs above one message: the spill
    async with Client(served.target, mode=mode) as client:
        result = await run_flow(client, served, "large", MESSAGE_BUDGET)
        link = [block for block in result.content if block.type == "resource_link"][0]
        run_id = result.meta["chainweaver"]["run_id"]
        assert str(link.uri) == result.meta["chainweaver"]["output"]["uri"] == \
            f"{served.runs}/{run_id}/output"
        head = (await client.read_resource(f"{link.uri}?offset=0&length=9"))[0]
        record = await answer(lambda: client.session.read_resource(
            f"{served.runs}/{run_id}"))
    assert head.blob is not None and base64.b64decode(head.blob) == b'{"data": '
    assert record["error"]["message"] == f"Resource not found: '{served.runs}/{run_id}'"


@pytest.mark.tasks
async def test_a_tasks_large_output_is_linked_where_its_client_reads_it() -> None:
    from fastmcp_tasks import call_tool_task

    server = FlowServer(catalogue(), tasks="memory://", run_history=RunHistory(output_limit=LIMIT))
    served = namespaced(server)
    async with Client(served.target) as client:
        task = await call_tool_task(client, "shop_large", {"n": 3 * LIMIT})
        with anyio.fail_after(30):
            result = await task.result()
        run_id = result.meta["chainweaver"]["run_id"]
        links = [block for block in result.content if block.type == "resource_link"]
        expected = f"{served.runs}/{run_id}/output"
        assert [str(link.uri) for link in links] == [expected]
        assert result.meta["chainweaver"]["output"]["uri"] == expected
        whole = (await client.read_resource(expected))[0].text
    assert json.loads(whole) == {"data": "x" * 3 * LIMIT}
