"""Every private FastMCP reach (chainweaver/mcp/fastmcp_seams.py) against the installed
FastMCP, and each one's degraded path: when FastMCP moves a name, the server still
answers every call, logs one warning, and only the feature the reach served stops.

The degraded paths are driven by renaming the attribute a seam looks for (the seams
keep those names as module constants), which is exactly what a FastMCP release that
moves it does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import mcp_types
import pytest
from fastmcp import Client, FastMCP
from mcp import MCPError
from mcp_types import LOG_LEVEL_META_KEY
from pydantic import BaseModel
from support.catalogue import build_catalogue

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer, fastmcp_seams

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
SEAM_LOGGER = "chainweaver.mcp.fastmcp_seams"


class Order(BaseModel):
    order_id: str
    status: str


class Priced(BaseModel):
    order_id: str
    cents: int


@tool(safety=ToolSafetyContract("read"))
def look_up(order_id: str) -> Order:
    return Order(order_id=order_id, status="open")


@tool(safety=ToolSafetyContract("read"))
def price(order_id: str) -> Priced:
    return Priced(order_id=order_id, cents=120)


def flow_server(**options: Any) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(look_up)
    executor.register_tool(price)
    executor.registry.register_flow(Flow("quote", "Price an order.",
                                         [FlowStep("look_up"), FlowStep("price")]))
    return FlowServer(executor, **options)


class Reports:
    """What a client's progress and log handlers received."""

    def __init__(self) -> None:
        self.progress: list[float] = []
        self.logs: list[str] = []

    async def on_progress(self, progress: float, total: float | None,
                          message: str | None) -> None:
        self.progress.append(progress)

    async def on_log(self, message: Any) -> None:
        self.logs.append(message.data["msg"])

    def client(self, target: Any, mode: str) -> Client:
        return Client(target, mode=mode, progress_handler=self.on_progress,
                      log_handler=self.on_log)


async def call_with_reports(server: FlowServer, mode: str) -> tuple[Any, Reports]:
    """A flow call that asks for progress and info-level log messages."""
    reports = Reports()
    meta = None if mode == "legacy" else {LOG_LEVEL_META_KEY: "info"}
    async with reports.client(server.fastmcp, mode) as client:
        if mode == "legacy":
            await client.set_logging_level("info")
        result = await client.call_tool("quote", {"order_id": "A-1"}, meta=meta)
    return result, reports


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    fastmcp_seams._warned.clear()
    yield
    fastmcp_seams._warned.clear()


def seam_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SEAM_LOGGER]


# ------------------------------------------------------------ the installed FastMCP


@pytest.mark.parametrize("mode", ERAS)
async def test_every_seam_reaches_the_installed_fastmcp(
        mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=SEAM_LOGGER)
    server = flow_server(expose_schemas=True)
    assert fastmcp_seams.low_level_server(server.fastmcp) is not None
    assert fastmcp_seams.install_input_schema_lookup(server.fastmcp, lambda name: None)
    handler, readable = fastmcp_seams.completion_handler(server.fastmcp)
    assert readable and handler is not None  # the provider's completions
    closed: list[bool] = []
    probe = FastMCP("probe")

    @probe.tool
    def connection() -> str:
        """Register a callback on this request's connection."""
        from fastmcp.server.dependencies import get_context

        session = get_context().request_context.session
        return str(fastmcp_seams.on_connection_close(session, lambda: closed.append(True)))

    async with Client(probe, mode=mode) as client:
        assert (await client.call_tool("connection")).content[0].text == "True"
    assert closed  # the connection ended, and said so
    result, reports = await call_with_reports(flow_server(), mode)
    assert result.structured_content == {"order_id": "A-1", "cents": 120}
    assert reports.progress == [1.0, 2.0] and reports.logs
    assert seam_warnings(caplog) == []


# ------------------------------------------------------------------- degraded paths


@pytest.mark.parametrize("mode", ERAS)
async def test_a_moved_low_level_server_degrades_only_notifications(
        mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=SEAM_LOGGER)
    monkeypatch.setattr(fastmcp_seams, "LOW_LEVEL_SERVER", "_moved_in_a_new_release")
    server = flow_server(expose_schemas=True, expose_prompts=True)
    result, reports = await call_with_reports(server, mode)
    assert result.structured_content == {"order_id": "A-1", "cents": 120}
    assert reports.logs  # run log messages do not depend on this seam
    async with Client(server.fastmcp, mode=mode) as client:
        assert [t.name for t in await client.list_tools()] == ["quote"]
        assert await client.read_resource("chainweaver://flows/quote/schema")
        assert await client.get_prompt("quote", {"order_id": "A-1"})
    # Once per seam, however many servers and calls: the listen stream and cursors,
    # and the Mcp-Param-* lookup installed through the same low-level server.
    warned = seam_warnings(caplog)
    assert len(warned) == 2
    assert "list cursors" in warned[0] and "Mcp-Param" in warned[1]


async def test_a_moved_low_level_server_still_mounts_without_parent_subscriptions(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=SEAM_LOGGER)
    monkeypatch.setattr(fastmcp_seams, "LOW_LEVEL_SERVER", "_moved_in_a_new_release")
    parent = FastMCP("parent")
    flow_server(expose_schemas=True).mount_into(parent, namespace="shop")
    async with Client(parent) as client:
        result = await client.call_tool("shop_quote", {"order_id": "A-1"})
        assert result.structured_content == {"order_id": "A-1", "cents": 120}
        with pytest.raises(MCPError) as caught:  # the parent serves no listen stream
            await client.session.send_request(
                mcp_types.SubscriptionsListenRequest(
                    params=mcp_types.SubscriptionsListenRequestParams(
                        notifications=mcp_types.SubscriptionFilter(
                            tools_list_changed=True))),
                mcp_types.SubscriptionsListenResult)
    assert caught.value.error.code == mcp_types.METHOD_NOT_FOUND
    assert len([m for m in seam_warnings(caplog) if "_mcp_server" in m]) == 1


async def test_a_moved_request_handler_map_keeps_serving(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=SEAM_LOGGER)
    monkeypatch.setattr(fastmcp_seams, "REQUEST_HANDLERS", "_moved_in_a_new_release")
    server = flow_server(expose_schemas=True)
    fastmcp_seams.forget_request_handler(server.fastmcp, "resources/subscribe")
    fastmcp_seams.forget_request_handler(server.fastmcp, "resources/unsubscribe")
    result, _ = await call_with_reports(server, "legacy")
    assert not result.is_error
    assert len(seam_warnings(caplog)) == 1


@pytest.mark.parametrize("mode", ERAS)
async def test_a_moved_input_schema_hook_leaves_calls_working(
        mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=SEAM_LOGGER)
    monkeypatch.setattr(fastmcp_seams, "INPUT_SCHEMA_LOOKUP", "_moved_in_a_new_release")
    server = flow_server()
    result, _ = await call_with_reports(server, mode)
    assert result.structured_content == {"order_id": "A-1", "cents": 120}
    assert any("Mcp-Param" in message for message in seam_warnings(caplog))


async def test_a_moved_completion_handler_still_mounts(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=SEAM_LOGGER)
    monkeypatch.setattr(fastmcp_seams, "COMPLETION_HANDLER", "_moved_in_a_new_release")
    parent = FastMCP("parent")
    FlowServer(build_catalogue(), expose_schemas=True).mount_into(parent, namespace="shop")
    template = mcp_types.ResourceTemplateReference(
        uri="chainweaver://shop/flows/{published_name}/schema")
    async with Client(parent) as client:
        offered = (await client.complete(template, {"name": "published_name",
                                                    "value": "price"})).values
    assert offered == ["price_quote"]  # the mounted server's completions still answer
    warned = seam_warnings(caplog)
    assert len(warned) == 1 and "mount_into replaces" in warned[0]


def test_a_moved_task_check_is_skipped_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=SEAM_LOGGER)

    class Extension:
        checked: list[str] = []

    extension = Extension()
    for _ in range(3):
        fastmcp_seams.check_task_request(extension, object(), "task-1")
    assert len(seam_warnings(caplog)) == 1

    class Checking:
        def __init__(self) -> None:
            self.checked: list[str] = []

        def _check_task_request(self, ctx: Any, task_id: str) -> None:
            self.checked.append(task_id)

    checking = Checking()
    fastmcp_seams.check_task_request(checking, object(), "task-2")
    assert checking.checked == ["task-2"]


def test_a_moved_docket_or_lifespan_fails_only_tasks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = FastMCP("tasks")
    monkeypatch.setattr(fastmcp_seams, "DOCKET", "_moved_in_a_new_release")
    assert fastmcp_seams.running_docket(server) is None  # tasks: "not running"
    monkeypatch.setattr(fastmcp_seams, "LIFESPAN_MANAGER", "_moved_in_a_new_release")
    with pytest.raises(RuntimeError, match="chainweaver worker needs it"):
        fastmcp_seams.lifespan_manager(server)


# ------------------------------------------------- OpenTelemetry's global providers


def test_the_opentelemetry_globals_are_where_the_seam_reads_them() -> None:
    import importlib

    for module_name, attribute, _variable in fastmcp_seams.OTEL_GLOBALS.values():
        assert hasattr(importlib.import_module(module_name), attribute)


@pytest.mark.parametrize("kind", ["tracer", "meter"])
def test_an_unset_provider_is_told_without_the_environment(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module_name, attribute, variable = fastmcp_seams.OTEL_GLOBALS[kind]
    monkeypatch.setattr(f"{module_name}.{attribute}", None)
    monkeypatch.setattr(fastmcp_seams, "_otel_named", {})
    monkeypatch.delenv(variable, raising=False)
    assert fastmcp_seams.otel_global_unset(kind)
    # The environment is read once: a variable naming a provider, seen first, sends
    # every later question to OpenTelemetry's public API (which loads it).
    monkeypatch.setattr(fastmcp_seams, "_otel_named", {})
    monkeypatch.setenv(variable, "some_provider")
    assert not fastmcp_seams.otel_global_unset(kind)
    monkeypatch.setattr(f"{module_name}.{attribute}", object())  # set in code
    monkeypatch.delenv(variable)
    monkeypatch.setattr(fastmcp_seams, "_otel_named", {})
    assert not fastmcp_seams.otel_global_unset(kind)


def test_a_provider_set_after_the_server_is_built_is_seen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from chainweaver.mcp.runs.metrics import ServerMetrics
    from chainweaver.mcp.runs.telemetry import tracing

    monkeypatch.setattr("opentelemetry.trace._TRACER_PROVIDER", None)
    monkeypatch.setattr("opentelemetry.metrics._internal._METER_PROVIDER", None)
    metrics = ServerMetrics()
    assert not tracing() and not metrics.recording()
    tracer, meter = TracerProvider(), MeterProvider()
    # What set_tracer_provider / set_meter_provider store (those run once per process).
    monkeypatch.setattr("opentelemetry.trace._TRACER_PROVIDER", tracer)
    monkeypatch.setattr("opentelemetry.metrics._internal._METER_PROVIDER", meter)
    assert trace.get_tracer_provider() is tracer
    assert otel_metrics.get_meter_provider() is meter
    assert tracing() and metrics.recording()


async def test_moved_opentelemetry_globals_ask_the_public_api(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from chainweaver.mcp.runs.metrics import ServerMetrics
    from chainweaver.mcp.runs.telemetry import tracing

    caplog.set_level(logging.WARNING, logger=SEAM_LOGGER)
    monkeypatch.setattr(fastmcp_seams, "OTEL_GLOBALS", {
        kind: (module, "_moved_in_a_new_release", variable)
        for kind, (module, _, variable) in fastmcp_seams.OTEL_GLOBALS.items()})
    asked: list[str] = []
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader])

    def meter_provider() -> Any:
        asked.append("meter")
        return meter

    def tracer_provider() -> Any:
        asked.append("tracer")
        return trace.NoOpTracerProvider()

    monkeypatch.setattr(otel_metrics, "get_meter_provider", meter_provider)
    monkeypatch.setattr(trace, "get_tracer_provider", tracer_provider)
    metrics = ServerMetrics()
    asked.clear()
    assert metrics.recording() and not tracing()  # the public API's answers
    assert asked == ["meter", "tracer"]
    server = flow_server(meter_provider=None)
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("quote", {"order_id": "A-1"})
    assert result.structured_content == {"order_id": "A-1", "cents": 120}
    counted = reader.get_metrics_data()  # the global provider the public API gave
    assert counted is not None and counted.resource_metrics
    warned = seam_warnings(caplog)
    assert len(warned) == 2 and all("OpenTelemetry" in line for line in warned)


# ------------------------------------------------ the client's log level (public API)


async def test_a_log_level_belongs_to_the_connection_that_set_it() -> None:
    server = flow_server()
    _, asked = await call_with_reports(server, "legacy")
    assert asked.logs
    # Another connection that never set a level gets its result and no messages.
    quiet = Reports()
    async with quiet.client(server.fastmcp, "legacy") as client:
        result = await client.call_tool("quote", {"order_id": "A-1"})
    assert not result.is_error and quiet.logs == []


def test_the_kept_levels_are_bounded_whatever_sessions_send() -> None:
    from chainweaver.mcp.gate.log_level import SessionLevels

    levels = SessionLevels(max_sessions=100)
    for number in range(10_000):  # a stream of sessions, each setting a level
        levels.set(f"session-{number}", "debug")
    assert len(levels) == 100
    assert levels.get("session-9999") == "debug" and levels.get("session-0") is None


async def test_a_server_that_keeps_no_sessions_keeps_no_level() -> None:
    server = flow_server()
    server._gate.without_sessions()  # as serve("streamable-http", stateless=True) does
    result, reports = await call_with_reports(server, "legacy")
    assert result.structured_content == {"order_id": "A-1", "cents": 120}
    assert reports.logs == []  # asked for, but there is no session to keep it for


async def test_an_invalid_level_is_refused_and_changes_nothing() -> None:
    server = flow_server()
    reports = Reports()
    async with reports.client(server.fastmcp, "legacy") as client:
        with pytest.raises(MCPError) as refused:
            await client.session.send_request(
                mcp_types.Request(method="logging/setLevel", params={"level": "loud"}),
                mcp_types.EmptyResult)
        assert refused.value.error.code == -32602
        result = await client.call_tool("quote", {"order_id": "A-1"})
    assert not result.is_error and reports.logs == []
