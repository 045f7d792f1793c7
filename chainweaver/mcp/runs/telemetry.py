"""OpenTelemetry spans for flow runs: one per ``tools/call`` of a flow, one per step.

They nest under FastMCP's own ``tools/call {name}`` SERVER span (FastMCP opens it
around its whole middleware chain). The flow span is not made current, so spans that
tools open themselves nest under FastMCP's span, beside it. Attributes are the flow's
name, version and tool name, and per step its id, status, attempts and duration (plus
the error type and fallback when the tool result's metadata carries them, which ``error_detail``
governs). Never argument values, outputs or error messages.

Spans are built from the step records the tool result carries (``_meta.chainweaver``)
once the run is over: each step span starts when the step started (``started_ms`` after
the run's start) and lasts its measured duration, so steps that ran at the same time
overlap. Spans cost next to nothing until an OpenTelemetry SDK is configured.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fastmcp.server.middleware import Middleware, MiddlewareContext
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from chainweaver import __version__
from chainweaver.mcp.publish.exposure import ExposedFlow

if TYPE_CHECKING:
    from chainweaver.mcp.gate.security import SecurityGate

TRACER = trace.get_tracer("chainweaver", __version__)


class FlowTelemetry(Middleware):
    """Opens a span around each flow run, with a child span per step.

    Placed after the security gate, so it sees only admitted calls, and resolves the
    flow exactly as the gate does (in the caller's view: a hidden flow gets no span).
    """

    def __init__(self, gate: SecurityGate) -> None:
        self.gate = gate

    async def on_call_tool(self, context: MiddlewareContext, call_next: Any) -> Any:
        name = context.message.name
        server = context.fastmcp_context.fastmcp if context.fastmcp_context else None
        exposed = await self.gate.target_in(server, "tool", name)
        if exposed is None or not self.gate.views.current(self.gate.exposure).allows(exposed):
            return await call_next(context)
        # Not made the current span: FastMCP enriches its request span only while that
        # span is current, and would open a second SERVER span under this one.
        started = time.time_ns()
        span = TRACER.start_span(f"chainweaver.flow {exposed.flow.name}", start_time=started,
                                 attributes=flow_attributes(exposed, name))
        try:
            result = await call_next(context)
        except Exception as error:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.set_attribute("chainweaver.flow.status", "error")
            span.end()
            raise
        record_run(span, result, started)
        span.end()
        return result


def flow_attributes(exposed: ExposedFlow, tool_name: str) -> dict[str, str]:
    return {"chainweaver.flow.name": exposed.flow.name,
            "chainweaver.flow.version": exposed.flow.version,
            "chainweaver.flow.tool": tool_name}


def record_run(span: Span, result: Any, started_ns: int) -> None:
    """The run's status on ``span`` and a child span per step, from the result's meta."""
    failed = bool(getattr(result, "is_error", False))
    span.set_attribute("chainweaver.flow.status", "error" if failed else "ok")
    if failed:
        span.set_status(Status(StatusCode.ERROR, "flow failed"))
    if not span.is_recording():
        return
    meta = (getattr(result, "meta", None) or {}).get("chainweaver")
    steps = meta.get("steps") if isinstance(meta, Mapping) else None
    if isinstance(steps, Sequence):
        _step_spans(span, steps, started_ns)


def _step_spans(parent: Span, steps: Sequence[Any], start_ns: int) -> None:
    """One span per step, each placed at its own start after ``start_ns``."""
    context = trace.set_span_in_context(parent)
    for step in steps:
        if not isinstance(step, Mapping):
            continue
        begin = start_ns + int(float(step.get("started_ms", 0.0)) * 1_000_000)
        duration_ns = int(float(step.get("duration_ms", 0.0)) * 1_000_000)
        attributes: dict[str, Any] = {
            "chainweaver.step.id": str(step.get("id", "")),
            "chainweaver.step.status": str(step.get("status", "")),
            "chainweaver.step.attempts": int(step.get("attempts", 0)),
            "chainweaver.step.duration_ms": float(step.get("duration_ms", 0.0)),
        }
        for key in ("error", "fallback"):
            if isinstance(step.get(key), str):
                attributes[f"chainweaver.step.{key}"] = step[key]
        span = TRACER.start_span(f"chainweaver.step {attributes['chainweaver.step.id']}",
                                 context=context, start_time=begin, attributes=attributes)
        if step.get("status") == "failed":
            span.set_status(Status(StatusCode.ERROR, "step failed"))
        nested = step.get("steps")
        if isinstance(nested, Sequence):
            _step_spans(span, nested, begin)  # a sub-flow's steps count from its start
        span.end(end_time=begin + duration_ns)
