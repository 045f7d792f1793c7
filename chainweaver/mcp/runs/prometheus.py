"""A Prometheus scrape endpoint for a server's OpenTelemetry metrics (``chainweaver serve
--metrics-port``). Needs the OpenTelemetry SDK (the ``metrics`` extra).

The SDK's in-memory reader collects on each scrape and this module writes the
Prometheus text format (0.0.4) itself: counters as ``*_total``, histograms as
``*_bucket`` / ``*_sum`` / ``*_count``, durations in seconds. No exporter package is
needed. The endpoint listens on its own address (a thread of this process), apart from
the MCP transport, so it can stay on a private interface.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_:]")
_UNITS = {"s": "_seconds", "By": "_bytes"}


def metrics_pipeline() -> tuple[Any, Any]:
    """An SDK ``MeterProvider`` and the in-memory reader a scrape collects from."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:
        raise ImportError("metrics need the OpenTelemetry SDK: pip install "
                          "'opentelemetry-sdk>=1.45.2'") from None
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def prometheus_text(reader: Any) -> str:
    """Everything ``reader`` (an SDK ``InMemoryMetricReader``) holds, as Prometheus text."""
    data = reader.get_metrics_data()
    lines: list[str] = []
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                lines += _metric_lines(metric)
    return "\n".join(lines) + "\n"


def _metric_lines(metric: Any) -> list[str]:
    name = _UNSAFE.sub("_", metric.name) + _UNITS.get(metric.unit or "", "")
    points = metric.data.data_points
    help_line = f"# HELP {name} {_escape_help(metric.description or metric.name)}"
    if hasattr(metric.data, "is_monotonic"):  # a sum
        kind = "counter" if metric.data.is_monotonic else "gauge"
        shown = name + ("_total" if kind == "counter" else "")
        return [help_line.replace(name, shown, 1), f"# TYPE {shown} {kind}",
                *(f"{shown}{_labels(p.attributes)} {_number(p.value)}" for p in points)]
    if hasattr(metric.data, "aggregation_temporality") and points \
            and hasattr(points[0], "bucket_counts"):
        lines = [help_line, f"# TYPE {name} histogram"]
        for point in points:
            lines += _histogram(name, point)
        return lines
    return [help_line, f"# TYPE {name} gauge",
            *(f"{name}{_labels(p.attributes)} {_number(p.value)}" for p in points)]


def _histogram(name: str, point: Any) -> list[str]:
    lines, total = [], 0
    bounds = [*(_number(b) for b in point.explicit_bounds), "+Inf"]
    for bound, count in zip(bounds, point.bucket_counts, strict=False):
        total += count
        lines.append(f"{name}_bucket{_labels(point.attributes, le=bound)} {total}")
    lines.append(f"{name}_sum{_labels(point.attributes)} {_number(point.sum)}")
    lines.append(f"{name}_count{_labels(point.attributes)} {point.count}")
    return lines


def _labels(attributes: Mapping[str, Any] | None, **extra: str) -> str:
    pairs: Iterable[tuple[str, Any]] = [*(attributes or {}).items(), *extra.items()]
    shown = [f'{_UNSAFE.sub("_", key)}="{_escape(str(value))}"' for key, value in pairs]
    return "{" + ",".join(shown) + "}" if shown else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class MetricsEndpoint:
    """Serves ``GET {path}`` with :func:`prometheus_text` on ``host:port``, in a daemon
    thread, until :meth:`stop`."""

    def __init__(self, reader: Any, host: str = "127.0.0.1", port: int = 9464,
                 path: str = "/metrics") -> None:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                if self.path.split("?", 1)[0] != path:
                    self.send_error(404)
                    return
                body = prometheus_text(endpoint.reader).encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds would flood stderr

        self.reader = reader
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="chainweaver-metrics", daemon=True)

    def start(self) -> MetricsEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
