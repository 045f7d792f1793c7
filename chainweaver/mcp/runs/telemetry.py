"""OpenTelemetry spans for flow runs: one per ``tools/call`` of a flow, one per step.

They nest under FastMCP's own ``tools/call {name}`` SERVER span (FastMCP opens it
around its whole middleware chain). The flow span is not made current, so spans that
tools open themselves nest under FastMCP's span, beside it. Attributes are the flow's
name, version and tool name, and per step its id, status, attempts and duration, plus
its error type (unless ``error_detail`` is ``"generic"``) and fallback: what the tool
result's ``_meta`` tells the caller, read from the step records themselves. Never
argument values, outputs or error messages.

Step spans come from the run itself: the security gate asks
:meth:`FlowTelemetry.begin` for each admitted call, which puts a run observer in the
request's admission; the flow tool fans the run's step events out to it, and each step
span is opened as its step ends, starting when the step started (``started_ms`` after
the run's start) and lasting its measured duration, so steps that ran at the same
time overlap. Spans cost next to nothing until an OpenTelemetry SDK is configured.
"""

from __future__ import annotations

import time
from asyncio import CancelledError
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from chainweaver import __version__
from chainweaver.executor import StepRecord
from chainweaver.mcp.fastmcp_seams import otel_global_unset
from chainweaver.mcp.gate.admission import Admission
from chainweaver.mcp.publish.exposure import ExposedFlow, Exposure
from chainweaver.mcp.runs.metrics import ServerMetrics, StepCounter
from chainweaver.mcp.runs.step_names import ALL_VISIBLE, StepNames, step_names
from chainweaver.run_events import RunObserver

TRACER = trace.get_tracer("chainweaver", __version__)


class FlowTelemetry:
    """Opens a span around each flow run, with a child span per step, and (with metrics
    on) counts runs and steps by status.

    The security gate asks it to begin watching every ``tools/call`` it serves
    (:meth:`begin`; no middleware layer of its own), with the request's admission:
    only admitted calls of a flow in the caller's view get a span. It watches the
    run's steps through the admission's run observers.
    """

    def __init__(self, exposure: Exposure, error_detail: str = "full",
                 metrics: ServerMetrics | None = None) -> None:
        self.exposure = exposure  # the gate's, for the step names the caller may see
        self.error_detail = error_detail
        self.metrics = metrics  # runs and steps by status, beside the spans

    def begin(self, record: Admission) -> tuple[Admission, RunWatch] | None:
        """The admitted call ``record`` with this run's observers added, and the watch
        to tell how it ended (None: not a flow in the caller's view, or nothing records
        spans or counts: none is built)."""
        exposed = record.target
        if record.kind != "tool" or exposed is None or record.view is None:
            return None
        counting = self.metrics is not None and self.metrics.recording()
        traced = tracing()
        if not counting and not traced:
            return None
        watching: tuple[RunObserver, ...] = ()
        span: Span | None = None
        if traced:
            # Not made the current span: FastMCP enriches its request span only while
            # that span is current, and would open a second SERVER span under this one.
            span = TRACER.start_span(f"chainweaver.flow {exposed.flow.name}",
                                     start_time=time.time_ns(),
                                     attributes=flow_attributes(exposed, exposed.tool_name))
            if span.is_recording():  # a sampler may still decline it
                names = step_names(record.view, self.exposure, exposed)
                watching = (StepSpans(span, names, self.error_detail),)
        counter = StepCounter(self.metrics, exposed.tool_name) \
            if counting and self.metrics is not None else None
        if counter is not None:
            watching += (counter,)
        return record.watched_by(watching), RunWatch(span, counter)


class RunWatch:
    """One flow run being watched: its span (if traced) and step counter (if counted)."""

    __slots__ = ("span", "counter", "started")

    def __init__(self, span: Span | None, counter: StepCounter | None) -> None:
        self.span = span
        self.counter = counter
        self.started = time.perf_counter()

    def done(self, result: Any) -> None:
        failed = bool(getattr(result, "is_error", False))
        self._run_finished("failed" if failed else "completed")
        if self.span is not None:
            self.span.set_attribute("chainweaver.flow.status", "error" if failed else "ok")
            if failed:
                self.span.set_status(Status(StatusCode.ERROR, "flow failed"))
            self.span.end()

    def failed(self, error: BaseException) -> None:
        self._run_finished("cancelled" if isinstance(error, CancelledError) else "failed")
        if self.span is not None:
            self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            self.span.set_attribute("chainweaver.flow.status", "error")
            self.span.end()

    def _run_finished(self, status: str) -> None:
        counter = self.counter
        if counter is not None and counter.started:
            counter.metrics.run_finished(counter.tool, status,
                                         time.perf_counter() - self.started)


def tracing() -> bool:
    """Whether an OpenTelemetry SDK records spans: without one (the API's placeholder or
    no-op provider) a run opens none (asked per call: an application may set it later)."""
    return not otel_global_unset("tracer") and not isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


class StepSpans(RunObserver):
    """A span per step of one run, under the run's span, opened as each step ends: it
    starts when the step started and lasts its measured duration, named and described
    as the caller may see the step (:mod:`.step_names`)."""

    def __init__(self, parent: Span, names: StepNames, error_detail: str) -> None:
        self.parent = parent
        self.names = names
        self.error_detail = error_detail
        self.run_started_ns = time.time_ns()

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self.run_started_ns = time.time_ns()  # step start times count from here

    def step_finished(self, record: StepRecord) -> None:
        if self.parent.is_recording():
            _step_spans(self.parent, (record,), self.run_started_ns, self.names,
                        self.error_detail)


def flow_attributes(exposed: ExposedFlow, tool_name: str) -> dict[str, str]:
    return {"chainweaver.flow.name": exposed.flow.name,
            "chainweaver.flow.version": exposed.flow.version,
            "chainweaver.flow.tool": tool_name}


def _step_spans(parent: Span, records: Sequence[StepRecord], start_ns: int,
                names: StepNames, error_detail: str) -> None:
    """One span per step record, each placed at its own start after ``start_ns``, named
    and described as the caller may see it (what ``run_meta`` tells the caller)."""
    context = trace.set_span_in_context(parent)
    for record in records:
        begin = start_ns + int(record.started_ms * 1_000_000)
        step_id = names.label(record.step_id)
        attributes: dict[str, Any] = {
            "chainweaver.step.id": step_id,
            "chainweaver.step.status": record.status,
            "chainweaver.step.attempts": record.attempts,
            "chainweaver.step.duration_ms": round(record.duration_ms, 3),
        }
        if record.error is not None and error_detail != "generic":
            attributes["chainweaver.step.error"] = record.error.type
        if record.fallback is not None:
            attributes["chainweaver.step.fallback"] = record.fallback
        span = TRACER.start_span(f"chainweaver.step {step_id}", context=context,
                                 start_time=begin, attributes=attributes)
        if record.status == "failed":
            span.set_status(Status(StatusCode.ERROR, "step failed"))
        if record.steps is not None and not names.hides(record.step_id):
            # A visible sub-flow's steps count from its start.
            _step_spans(span, record.steps, begin,
                        names.inner(record.step_id) or ALL_VISIBLE, error_detail)
        span.end(end_time=begin + int(record.duration_ms * 1_000_000))
