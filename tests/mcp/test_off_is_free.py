"""A feature that is off builds nothing on a call's path (issue 36, item 2).

With no run history, no approval in the plan, no metrics SDK, no recording tracer and
no run notifications asked for, a ``tools/call`` hands the executor no run observer at
all (the executor's ``observer=`` is the hook every one of them goes through), builds no
run record, labels no metric and opens no span, and a plan that needs no approval runs
no approval gate after its first run. Each feature switched on adds its own observer
and nothing else. Nothing here is timed.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.server.transforms import Namespace
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.watched import Watched, count, observers

import chainweaver.engine.lanes
import chainweaver.mcp.runs.metrics
import chainweaver.mcp.runs.recording
import chainweaver.mcp.runs.telemetry
from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract
from chainweaver.mcp import FlowServer, RunHistory, ServingConfig
from chainweaver.mcp.components.flow_tool import FlowTool
from chainweaver.mcp.components.prompts import AuthoredPrompt, FlowInvocationPrompt, GuidePrompt
from chainweaver.mcp.components.resources import JSONDocumentResource
from chainweaver.mcp.components.run_resources import RunResource
from chainweaver.mcp.runs.metrics import StepCounter
from chainweaver.mcp.runs.recording import RunRecorder
from chainweaver.mcp.runs.reporting import RunReporter
from chainweaver.run_events import ALWAYS_APPROVE


@pytest.fixture
def nothing_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OpenTelemetry SDK, whatever other tests in this process installed."""
    monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)
    monkeypatch.setattr(otel_metrics, "get_meter_provider", otel_metrics.NoOpMeterProvider)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many run records, metric label sets and spans a call built."""
    counts = {"records": 0, "labels": 0, "spans": 0, "gates": 0}
    record_class = chainweaver.mcp.runs.recording.RunRecord
    budget_name_of = chainweaver.mcp.runs.metrics.budget_name_of
    tracer = chainweaver.mcp.runs.telemetry.TRACER
    approval_gate = chainweaver.engine.lanes.approval_gate

    def counted(key: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return function(*args, **kwargs)
        return call

    monkeypatch.setattr(chainweaver.mcp.runs.recording, "RunRecord",
                        counted("records", record_class))
    monkeypatch.setattr(chainweaver.mcp.runs.metrics, "budget_name_of",
                        counted("labels", budget_name_of))
    monkeypatch.setattr(tracer, "start_span", counted("spans", tracer.start_span))
    monkeypatch.setattr(chainweaver.engine.lanes, "approval_gate",
                        counted("gates", approval_gate))
    return counts


async def call(server: FlowServer, text: str = "a b c", times: int = 1) -> None:
    async with Client(server.fastmcp) as client:
        for _ in range(times):
            result = await client.call_tool("count_words", {"text": text})
            assert result.structured_content == {"words": len(text.split())}


@pytest.mark.anyio
@pytest.mark.usefixtures("nothing_records")
async def test_with_everything_off_a_call_builds_no_observer_record_label_or_span(
        built: dict[str, int]) -> None:
    executor = Watched()
    server = FlowServer(executor, serving=ServingConfig(run_notifications=False))
    await call(server, times=3)
    assert [observers(h["observer"]) for h in executor.handed] == [[], [], []]
    assert all(h["approve"] is ALWAYS_APPROVE for h in executor.handed)
    # The plan's approval is worked out by its first run; later runs skip the gate.
    assert built == {"records": 0, "labels": 0, "spans": 0, "gates": 1}


@pytest.mark.anyio
@pytest.mark.usefixtures("nothing_records")
async def test_a_failed_run_without_history_still_builds_the_record_its_warning_names(
        built: dict[str, int], caplog: pytest.LogCaptureFixture) -> None:
    executor = Watched()
    server = FlowServer(executor, serving=ServingConfig(run_notifications=False))
    # Bad arguments are the caller's mistake: their line is at info (docs/run-history.md).
    caplog.set_level(logging.INFO, logger="chainweaver.mcp.runs")
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("count_words", {"text": 5}, raise_on_error=False)
    assert result.is_error
    assert built["records"] == 1
    run_id = result.meta["chainweaver"]["run_id"]
    assert any(run_id in message for message in caplog.messages)


@pytest.mark.anyio
@pytest.mark.usefixtures("nothing_records")
async def test_each_feature_on_adds_only_its_own_observer(
        built: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    history = Watched()
    await call(FlowServer(history, serving=ServingConfig(run_notifications=False),
                          run_history=RunHistory()))
    assert observers(history.handed[0]["observer"]) == [RunRecorder]
    assert built["records"] == 1 and built["labels"] == built["spans"] == 0

    reader = InMemoryMetricReader()
    metered = Watched()
    await call(FlowServer(metered, serving=ServingConfig(run_notifications=False),
                          meter_provider=MeterProvider(metric_readers=[reader])))
    assert observers(metered.handed[0]["observer"]) == [StepCounter]
    labelled = built["labels"]
    assert labelled >= 1 and built["spans"] == 0  # the call (and the client's other requests)

    reported = Watched()
    await call(FlowServer(reported))  # FastMCP's client asks for progress and logs
    assert observers(reported.handed[0]["observer"]) == [RunReporter]
    assert built["records"] == 1 and built["labels"] == labelled and built["spans"] == 0
    # A recording tracer adds StepSpans: tests/mcp/test_telemetry.py (it owns the SDK).


@pytest.mark.anyio
async def test_a_plan_that_needs_approval_asks_the_gate_on_every_run(
        built: dict[str, int]) -> None:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(count)
    executor.registry.register_flow(Flow("count_words", "Count words.", [FlowStep("count")]))
    guarded = Flow("guarded", "Count, approved.", [FlowStep("count")],
                   safety=ToolSafetyContract("write", requires_approval=True))
    executor.registry.register_flow(guarded)
    for _ in range(3):
        assert (await executor.execute_flow_async("count_words", {"text": "a"})).success
    assert built["gates"] == 1
    for _ in range(3):
        result = await executor.execute_flow_async("guarded", {"text": "a"})
        assert result.error is not None and result.error.type == "ApprovalRequired"
    assert built["gates"] == 4


@pytest.mark.parametrize("component", [FlowTool, JSONDocumentResource, RunResource,
                                       FlowInvocationPrompt, AuthoredPrompt, GuidePrompt])
def test_components_hold_no_pydantic_private_attributes(component: type) -> None:
    # A private attribute is read through pydantic's __getattr__ after a caught
    # AttributeError (~17.8 k instructions): what a call, read or render uses is slots.
    assert component.__private_attributes__ == {}


@pytest.mark.anyio
async def test_a_copied_flow_tool_keeps_what_it_runs_by() -> None:
    # FastMCP's Namespace renames a tool by copying it (model_copy); a deep copy too.
    server = FlowServer(Watched(), serving=ServingConfig(run_notifications=False))
    (built_tool,) = await server.fastmcp.list_tools()
    for copied in (built_tool.model_copy(update={"name": "renamed"}),
                   built_tool.model_copy(deep=True)):
        assert isinstance(copied, FlowTool)
        assert copied.exposed is built_tool.exposed
    server.fastmcp.add_transform(Namespace("shop"))
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("shop_count_words", {"text": "a b"})
    assert result.structured_content == {"words": 2}
