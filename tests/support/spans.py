"""Spans recorded for one test at a time.

OpenTelemetry's global tracer provider can be set once per process, and a span
processor added to it stays: an exporter that kept every span would grow through every
later test on the same xdist worker (and the load tests measure the server's memory).
The one exporter here keeps spans only while a test asks for them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class TestSpans(InMemorySpanExporter):
    """An in-memory exporter that drops what it is given while no test records."""

    __test__ = False  # not a test class, whatever its name says
    recording = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.recording:
            return SpanExportResult.SUCCESS
        return super().export(spans)


EXPORTER = TestSpans()
_installed = False


@contextmanager
def recorded_spans() -> Iterator[TestSpans]:
    """The process's exporter, cleared, recording until the block ends."""
    global _installed
    if not _installed:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        _installed = True
    EXPORTER.clear()
    EXPORTER.recording = True
    try:
        yield EXPORTER
    finally:
        EXPORTER.recording = False
        EXPORTER.clear()
