"""OpenTelemetry spans for flow runs and steps, nested under FastMCP's request span,
with no argument values; and the JSON Lines audit sink."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import Client, FastMCP
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from support.catalogue import build_catalogue
from support.spans import recorded_spans
from support.watched import Watched, observers

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig, ServingConfig, visible_claim
from chainweaver.mcp.gate.audit_log import JsonlAuditLog
from chainweaver.mcp.runs.telemetry import StepSpans

SECRET = "walrus-5521-secret"
SECRET_ORDER = "A-55217731"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recorded_spans() as exporter:
        yield exporter


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in finished}


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_flow_run_is_a_span_with_a_child_per_step(spans: InMemorySpanExporter,
                                                          mode: str) -> None:
    server = FlowServer(build_catalogue())
    async with Client(server.fastmcp, mode=mode) as client:
        await client.call_tool("order_status", {"order_id": SECRET_ORDER})
    found = by_name(spans.get_finished_spans())
    (request,) = [span for span in spans.get_finished_spans()
                  if span.name == "tools/call order_status" and span.kind.name == "SERVER"]
    run = found["chainweaver.flow order_status"]
    assert run.parent is not None and run.parent.span_id == request.context.span_id
    assert dict(run.attributes or {}) == {
        "chainweaver.flow.name": "order_status", "chainweaver.flow.version": "2.1.0",
        "chainweaver.flow.tool": "order_status", "chainweaver.flow.status": "ok"}
    steps = [span for span in spans.get_finished_spans()
             if span.name.startswith("chainweaver.step ")]
    assert [s.attributes["chainweaver.step.id"] for s in steps] == ["fetch_order",
                                                                     "summarise_order"]
    for step in steps:
        assert step.parent is not None and step.parent.span_id == run.context.span_id
        assert step.attributes["chainweaver.step.status"] == "completed"
        assert step.attributes["chainweaver.step.attempts"] == 1
        assert run.start_time <= step.start_time <= step.end_time
    dumped = " ".join(json.dumps(dict(s.attributes or {})) for s in spans.get_finished_spans())
    assert SECRET_ORDER not in dumped


@pytest.mark.anyio
async def test_a_failed_run_is_an_error_span_without_its_message(
        spans: InMemorySpanExporter) -> None:
    server = FlowServer(build_catalogue(), security=SecurityConfig(error_detail="type_only"))
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("failing_flow", {"query": "q"}, raise_on_error=False)
    assert result.is_error
    found = by_name(spans.get_finished_spans())
    run = found["chainweaver.flow failing_flow"]
    assert run.status.status_code.name == "ERROR"
    assert run.attributes["chainweaver.flow.status"] == "error"
    (step,) = [s for s in spans.get_finished_spans() if s.name.startswith("chainweaver.step")]
    assert step.attributes["chainweaver.step.status"] == "failed"
    assert step.attributes["chainweaver.step.error"] == "RuntimeError"
    assert "hunter2" not in repr([dict(s.attributes or {}) for s in found.values()])


@pytest.mark.anyio
async def test_a_flow_outside_the_view_gets_no_span(spans: InMemorySpanExporter) -> None:
    server = FlowServer(build_catalogue(), security=SecurityConfig(visible=visible_claim("teams")))
    async with Client(server.fastmcp) as client:
        await client.call_tool("order_status", {"order_id": "A"}, raise_on_error=False)
    assert not any(s.name.startswith("chainweaver.") for s in spans.get_finished_spans())


def event(number: int) -> AuditEvent:
    return AuditEvent(timestamp=1000.0 + number, phase="decision", kind="tool",
                      name=f"flow_{number:02d}", flow_name=None, flow_version=None,
                      caller_id="alice", decision="allowed", reason="ok")


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_audit_log_appends_json_lines_and_rotates(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(json.dumps({"name": "kept"}) + "\n")  # append-only: kept
    one = len(json.dumps(vars(event(1)), separators=(",", ":"))) + 1
    log = JsonlAuditLog(path, max_bytes=3 * one, backups=2)
    for number in range(1, 12):
        log(event(number))
    log.close()
    assert [e["name"] for e in lines(path)] == ["flow_09", "flow_10", "flow_11"]
    assert [e["name"] for e in lines(tmp_path / "audit.jsonl.1")] == [
        "flow_06", "flow_07", "flow_08"]
    assert [e["name"] for e in lines(tmp_path / "audit.jsonl.2")] == [
        "flow_03", "flow_04", "flow_05"]
    # Two backups: the oldest file (the kept line, flow_1, flow_2) is gone.
    assert not (tmp_path / "audit.jsonl.3").exists()
    with pytest.raises(ValueError, match="closed"):
        log(event(9))


def test_the_audit_log_syncs_on_its_cadence(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    now = [0.0]
    log = JsonlAuditLog(tmp_path / "a.jsonl", fsync_every=3, fsync_interval=10,
                        clock=lambda: now[0])
    for number in range(5):
        log(event(number))
    assert len(synced) == 1  # after the third event
    now[0] = 10.0
    log(event(6))  # the interval passed
    assert len(synced) == 2
    log.close()
    assert len(lines(tmp_path / "a.jsonl")) == 6


@pytest.mark.anyio
async def test_the_audit_log_serves_as_the_gate_audit_hook(tmp_path: Path) -> None:
    log = JsonlAuditLog(tmp_path / "audit.jsonl", fsync_every=1)
    server = FlowServer(build_catalogue(), security=SecurityConfig(audit_hook=log))
    async with Client(server.fastmcp) as client:
        await client.call_tool("price_quote", {"sku": SECRET})
    log.close()
    events = [e for e in lines(tmp_path / "audit.jsonl") if e["kind"] == "tool"]
    assert [(e["phase"], e["flow_name"]) for e in events] == [
        ("decision", "price_quote"), ("completed", "price_quote")]
    assert SECRET not in (tmp_path / "audit.jsonl").read_text()


def test_audit_log_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        JsonlAuditLog(tmp_path / "x", fsync_every=0)
    with pytest.raises(ValueError):
        JsonlAuditLog(tmp_path / "x", max_bytes=0)


class FanOut(BaseModel):
    left: int
    right: int


def _fan_out_executor() -> FlowExecutor:
    """A flow whose two middle steps run at the same time (async tools, one root)."""

    @tool(safety=ToolSafetyContract("none"))
    async def start(n: int) -> dict:
        """Start."""
        return {"n": n}

    @tool(safety=ToolSafetyContract("none"))
    async def left(n: int) -> dict:
        """Wait, then answer."""
        await asyncio.sleep(0.05)
        return {"left": n}

    @tool(safety=ToolSafetyContract("none"))
    async def right(n: int) -> dict:
        """Wait, then answer."""
        await asyncio.sleep(0.05)
        return {"right": n}

    executor = FlowExecutor(FlowRegistry())
    for each in (start, left, right):
        executor.register_tool(each)
    executor.registry.register_flow(Flow(
        "fan", "Two steps at once.", version="1.0.0",
        steps=[FlowStep("start"), FlowStep("left", after=["start"]),
               FlowStep("right", after=["start"])],
        output_schema=FanOut))
    return executor


@pytest.mark.anyio
async def test_step_spans_start_when_their_steps_started(spans: InMemorySpanExporter) -> None:
    server = FlowServer(_fan_out_executor())
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("fan", {"n": 1})
    assert result.structured_content == {"left": 1, "right": 1}
    found = by_name(spans.get_finished_spans())
    run = found["chainweaver.flow fan"]
    first, left, right = (found[f"chainweaver.step {name}"]
                          for name in ("start", "left", "right"))
    assert run.start_time <= first.start_time <= first.end_time
    # Both middle steps start after the root ended, and they overlap: they ran at once
    # (laid out one after another, the second would start where the first ended).
    assert first.end_time <= left.start_time and first.end_time <= right.start_time
    assert left.start_time < right.end_time and right.start_time < left.end_time


@pytest.mark.anyio
@pytest.mark.parametrize("hooks", [False, True])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_mounted_flow_run_is_one_span_named_as_its_server_publishes_it(
        spans: InMemorySpanExporter, hooks: bool, mode: str) -> None:
    # With hooks the parent's chain admits the call (MountedGate), without them the
    # mounted server's own chain does: either way the gate opens one span per run.
    events: list[AuditEvent] = []
    security = SecurityConfig(audit_hook=events.append) if hooks else None
    parent = FastMCP("parent")
    FlowServer(build_catalogue(), security=security).mount_into(parent, namespace="shop")
    async with Client(parent, mode=mode) as client:
        await client.call_tool("shop_order_status", {"order_id": SECRET_ORDER})
    runs = [s for s in spans.get_finished_spans() if s.name.startswith("chainweaver.flow ")]
    assert [dict(run.attributes or {}) for run in runs] == [{
        "chainweaver.flow.name": "order_status", "chainweaver.flow.version": "2.1.0",
        "chainweaver.flow.tool": "order_status", "chainweaver.flow.status": "ok"}]
    steps = [s for s in spans.get_finished_spans() if s.name.startswith("chainweaver.step ")]
    assert [s.parent.span_id for s in steps if s.parent] == [runs[0].context.span_id] * 2
    assert bool(events) == hooks


@pytest.mark.anyio
async def test_a_recording_tracer_adds_only_its_step_spans_to_a_run(
        spans: InMemorySpanExporter) -> None:
    executor = Watched()
    server = FlowServer(executor, serving=ServingConfig(run_notifications=False))
    async with Client(server.fastmcp) as client:
        await client.call_tool("count_words", {"text": "a b"})
    assert observers(executor.handed[0]["observer"]) == [StepSpans]
    assert "chainweaver.flow count_words" in by_name(spans.get_finished_spans())
