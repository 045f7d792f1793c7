"""OpenTelemetry metrics: every request by kind, outcome and published name, and flow
runs and their steps by status.

Label values come only from the published catalogue and fixed vocabularies, never from
what a client sends: the ``name`` is the rate limiter's budget name
(:func:`~chainweaver.mcp.gate.rate_limit.budget_name`): a name the caller's view does
not publish counts as :data:`UNPUBLISHED`, a run URI as ``chainweaver://runs``, a list,
completion, subscription or task request as its method. So a client inventing names
cannot grow the number of time series.

Instruments (OpenTelemetry names; Prometheus shows dots as underscores):

- ``chainweaver.requests`` (counter) and ``chainweaver.request.duration`` (histogram,
  seconds, from admission to answer; refusals are counted, not timed): ``kind`` (tool,
  resource, prompt, list, completion, subscription, task), ``outcome``
  (:data:`OUTCOMES`) and ``name``.
- ``chainweaver.runs`` (counter) and ``chainweaver.run.duration`` (histogram, seconds):
  ``tool`` and ``status`` (completed, failed, cancelled), for every run that started
  (valid input): inline ``tools/call`` runs, timed from the call, and each leg a
  background task's worker runs, timed from the leg (a leg that only asks for approval
  runs nothing and is not counted).
- ``chainweaver.steps`` (counter): ``tool`` and ``status`` (the step's status), inline
  and in background tasks alike.

Both histograms advise the buckets :data:`DURATION_BUCKETS` (100 µs to an hour); an
application's own SDK ``View`` still overrides them.

Without a configured SDK the instruments are OpenTelemetry's no-ops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from fastmcp.exceptions import NotFoundError, ValidationError
from mcp import MCPError
from mcp_types import INVALID_PARAMS
from opentelemetry import metrics as otel_metrics

from chainweaver import __version__
from chainweaver.executor import StepRecord
from chainweaver.mcp.fastmcp_seams import otel_global_unset
from chainweaver.mcp.gate.admission import Admission
from chainweaver.mcp.gate.rate_limit import UNPUBLISHED, budget_name, budget_name_of
from chainweaver.mcp.hooks import GATE_REFUSED, GateContext
from chainweaver.mcp.publish.exposure import Exposure
from chainweaver.mcp.publish.run_uris import RUNS_URI
from chainweaver.run_events import RunObserver

__all__ = ["DURATION_BUCKETS", "OUTCOMES", "UNPUBLISHED", "RequestMetrics", "ServerMetrics",
           "StepCounter"]

# The request kinds counted, by method; other methods (initialize, ping) are not.
KINDS: Mapping[str, str] = {
    "tools/call": "tool", "resources/read": "resource", "prompts/get": "prompt",
    "tools/list": "list", "resources/list": "list", "resources/templates/list": "list",
    "prompts/list": "list", "completion/complete": "completion",
    "subscriptions/listen": "subscription", "resources/subscribe": "subscription",
    "resources/unsubscribe": "subscription", "tasks/get": "task", "tasks/cancel": "task",
    "tasks/update": "task", "tasks/result": "task", "tasks/list": "task",
}
OUTCOMES = ("ok", "error", "refused", "invalid", "not_found", "cancelled")
RUN_STATUSES = frozenset({"completed", "failed", "cancelled"})
STEP_STATUSES = frozenset({"completed", "failed", "skipped", "cancelled", "fallback"})
RESOURCE_NOT_FOUND = -32002
# Histogram bucket boundaries of both durations, in seconds: from 100 µs (an in-memory
# read or list) through seconds (flows calling services) to an hour (background tasks).
# OpenTelemetry's own default (0, 5, 10, ... 10000) is made for milliseconds, and would
# put every request under 5 s in one bucket.
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                    1800.0, 3600.0)


class ServerMetrics:
    """The instruments of one server, from ``provider`` (None: the global provider)."""

    def __init__(self, provider: Any = None) -> None:
        self.provider = provider
        source = provider if provider is not None else otel_metrics.get_meter_provider()
        meter = source.get_meter("chainweaver", __version__)
        self.requests = meter.create_counter(
            "chainweaver.requests", unit="{request}",
            description="MCP requests by kind, outcome and published name")
        self.request_duration = _duration_histogram(
            meter, "chainweaver.request.duration", "Time to answer an MCP request")
        self.runs = meter.create_counter("chainweaver.runs", unit="{run}",
                                         description="Flow runs by tool and status")
        self.run_duration = _duration_histogram(meter, "chainweaver.run.duration",
                                                "Flow run time")
        self.steps = meter.create_counter("chainweaver.steps", unit="{step}",
                                          description="Finished steps by tool and status")

    def recording(self) -> bool:
        """Whether anything records these instruments: a provider the server was given,
        or a global one an application set (asked each time: it may be set after the
        server is built). Off, a request builds no counter, label or timer."""
        if self.provider is not None:
            return not _unset(self.provider)
        return not otel_global_unset("meter") \
            and not _unset(otel_metrics.get_meter_provider())

    def refused(self, gate: GateContext, exposure: Exposure, runs_root: str = RUNS_URI
                ) -> None:
        """A request the gate refused (never served, so not timed); ``runs_root``:
        where its client reaches the run resources."""
        self.requests.add(1, {"kind": str(gate.kind), "outcome": "refused",
                              "name": budget_name(gate, exposure, runs_root)})

    def run_finished(self, tool: str, status: str, seconds: float) -> None:
        labels = {"tool": tool, "status": status if status in RUN_STATUSES else "failed"}
        self.runs.add(1, labels)
        self.run_duration.record(seconds, labels)


def _unset(provider: Any) -> bool:
    """Whether ``provider`` records nothing: OpenTelemetry's no-op provider, or the
    placeholder the API hands out until an application sets one (a private class, so
    told by its name; anything else counts as recording)."""
    return isinstance(provider, otel_metrics.NoOpMeterProvider) \
        or type(provider).__name__ == "_ProxyMeterProvider"


def _duration_histogram(meter: Any, name: str, description: str) -> Any:
    """A histogram in seconds advising :data:`DURATION_BUCKETS`; a meter of an API older
    than the advisory (1.23) gets the histogram without it."""
    try:
        return meter.create_histogram(name, unit="s", description=description,
                                      explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
    except TypeError:
        return meter.create_histogram(name, unit="s", description=description)


class StepCounter(RunObserver):
    """Counts one run's finished steps by status (a run observer), and notes whether the
    run started here: a call made as a background task runs elsewhere, and a call whose
    input was refused never starts."""

    def __init__(self, metrics: ServerMetrics, tool: str) -> None:
        self.metrics = metrics
        self.tool = tool
        self.started = False
        self.begun = time.perf_counter()
        self.counted = False

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self.started = True

    def step_finished(self, record: StepRecord) -> None:
        status = record.status if record.status in STEP_STATUSES else "other"
        self.metrics.steps.add(1, {"tool": self.tool, "status": status})

    def finished(self, status: str) -> None:
        """Count the run (once, and only if it started), timed from this counter's
        creation: how a background task's leg counts the run it ran."""
        if self.started and not self.counted:
            self.counted = True
            self.metrics.run_finished(self.tool, status, time.perf_counter() - self.begun)


class RequestMetrics:
    """Counts and times every request this server's gate admitted: the gate starts a
    timer for each (:meth:`start`; no middleware layer of its own) with its admission, so
    the name is the one the gate resolved. The gate counts its refusals through
    :meth:`ServerMetrics.refused`.
    """

    def __init__(self, metrics: ServerMetrics, exposure: Exposure) -> None:
        self.metrics = metrics
        self.exposure = exposure  # the gate's: names outside it count as unpublished

    def start(self, record: Admission, method: str) -> RequestTimer | None:
        """Start timing the admitted request ``record`` (None: not counted: not a
        request kind counted here, or no metrics SDK records)."""
        if record.kind is None or method not in KINDS or not self.metrics.recording():
            return None
        # Counted as the budgets count it, under the name this server publishes (see
        # AdmittedServing.count).
        name = budget_name_of(record.kind, record.name, record.target is not None,
                              self.exposure, record.runs_root)
        return RequestTimer(self.metrics, str(record.kind), name)


class RequestTimer:
    """One request being timed; :meth:`done` or :meth:`failed` counts it."""

    __slots__ = ("metrics", "kind", "name", "started")

    def __init__(self, metrics: ServerMetrics, kind: str, name: str) -> None:
        self.metrics = metrics
        self.kind = kind
        self.name = name
        self.started = time.perf_counter()

    def done(self, result: Any) -> None:
        # Only a call has an error result (a failed getattr of a pydantic model's
        # missing field raises inside, and costs every read and render).
        failed = self.kind == "tool" and (getattr(result, "is_error", False)
                                          or getattr(result, "isError", False))
        self._count("error" if failed else "ok")

    def failed(self, error: BaseException) -> None:
        self._count("cancelled" if isinstance(error, asyncio.CancelledError)
                    else outcome_of(error))

    def _count(self, outcome: str) -> None:
        labels = {"kind": self.kind, "outcome": outcome, "name": self.name}
        self.metrics.requests.add(1, labels)
        self.metrics.request_duration.record(time.perf_counter() - self.started, labels)


def outcome_of(error: BaseException) -> str:
    """The ``outcome`` label of a request that raised ``error``."""
    if isinstance(error, NotFoundError):
        return "not_found"
    if isinstance(error, ValidationError):
        return "invalid"  # FastMCP answers it -32602
    if isinstance(error, MCPError):
        return {GATE_REFUSED: "refused", INVALID_PARAMS: "invalid",
                RESOURCE_NOT_FOUND: "not_found"}.get(error.code, "error")
    return "error"
