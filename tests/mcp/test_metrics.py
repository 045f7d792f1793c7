"""OpenTelemetry metrics: requests by kind, outcome and published name, runs and steps
by status; label values stay within the published catalogue and fixed vocabularies
whatever names clients send; the Prometheus text endpoint serves them."""

from __future__ import annotations

import random
import string
import urllib.request
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.catalogue import build_catalogue

from chainweaver.mcp import CallerIdentity, FlowServer, SecurityConfig, ServingConfig
from chainweaver.mcp.publish.run_uris import RUNS_URI
from chainweaver.mcp.runs.metrics import OUTCOMES, UNPUBLISHED
from chainweaver.mcp.runs.prometheus import MetricsEndpoint, prometheus_text

MODES = ["auto", "legacy"]


def served(**security: Any) -> tuple[FlowServer, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(**security),
                        serving=ServingConfig(meter_provider=MeterProvider(
                            metric_readers=[reader])))
    return server, reader


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def counts(reader: InMemoryMetricReader, metric: str) -> dict[tuple[str, ...], int]:
    return {tuple(sorted(p.attributes.items())): p.value
            for p in points(reader).get(metric, [])}


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_requests_runs_and_steps_are_counted_with_published_names(mode: str) -> None:
    server, reader = served()
    async with Client(server.fastmcp, mode=mode) as client:
        await client.call_tool("product_search", {"query": "lamp"})
        assert (await client.call_tool("failing_flow", {"query": "x"},
                                       raise_on_error=False)).is_error
        await client.read_resource("chainweaver://flows")
        await client.get_prompt("chainweaver_guide")
        with pytest.raises(MCPError):
            await client.get_prompt("product_search", {"limit": "not a number"})
    requests = counts(reader, "chainweaver.requests")
    expected = {("tool", "ok", "product_search"), ("tool", "error", "failing_flow"),
                ("resource", "ok", "chainweaver://flows"),
                ("prompt", "ok", "chainweaver_guide"), ("prompt", "invalid", "product_search")}
    seen = {(dict(k)["kind"], dict(k)["outcome"], dict(k)["name"]) for k in requests}
    assert expected <= seen
    runs = counts(reader, "chainweaver.runs")
    assert runs[(("status", "completed"), ("tool", "product_search"))] == 1
    assert runs[(("status", "failed"), ("tool", "failing_flow"))] == 1
    steps = counts(reader, "chainweaver.steps")
    assert steps[(("status", "failed"), ("tool", "failing_flow"))] >= 1
    durations = {tuple(sorted(p.attributes.items())): p.count
                 for p in points(reader)["chainweaver.request.duration"]}
    assert durations[(("kind", "tool"), ("name", "product_search"), ("outcome", "ok"))] == 1


def _random_name(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits + "_", k=12))


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_stream_of_random_names_never_grows_the_label_sets(mode: str) -> None:
    refuse = {"on": False}
    server, reader = served(
        authenticator=lambda ctx: CallerIdentity("someone"),
        authorizer=lambda ctx: not refuse["on"])
    rng = random.Random(27)
    published = {*server.registered_tool_names, *server.resource_uris, *server.prompt_names}
    async with Client(server.fastmcp, mode=mode) as client:
        sizes = []
        for refusing in (False, False, True, True):
            refuse["on"] = refusing
            for _ in range(40):
                name = _random_name(rng)
                for request in (client.call_tool(name, {}),
                                client.read_resource(f"chainweaver://flows/{name}/schema"),
                                client.read_resource(f"chainweaver://runs/{name}"),
                                client.get_prompt(name)):
                    with pytest.raises(Exception):  # noqa: B017 - MCPError or ToolError
                        await request
            sizes.append({metric: len(found) for metric, found in points(reader).items()})
    # 40 new random names per round: not one new time series after the first round of
    # each kind of answer.
    assert sizes[1] == sizes[0] and sizes[3] == sizes[2]
    for point in points(reader)["chainweaver.requests"]:
        labels = point.attributes
        assert set(labels) == {"kind", "outcome", "name"}
        assert labels["outcome"] in OUTCOMES
        assert labels["name"] in published | {UNPUBLISHED, "tools/list", RUNS_URI}, labels
    assert len(points(reader)["chainweaver.requests"]) <= 3 * len(OUTCOMES) + 2


@pytest.mark.anyio
async def test_refusals_are_counted_under_the_budget_name() -> None:
    server, reader = served(authenticator=lambda ctx: None)
    async with Client(server.fastmcp) as client:
        for name in ("product_search", "zz_invented"):
            with pytest.raises(MCPError):
                await client.get_prompt(name)
    requests = counts(reader, "chainweaver.requests")
    assert requests[(("kind", "prompt"), ("name", UNPUBLISHED), ("outcome", "refused"))] == 2


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_prometheus_endpoint_serves_the_text_format() -> None:
    server, reader = served()
    async with Client(server.fastmcp) as client:
        await client.call_tool("product_search", {"query": "lamp"})
    endpoint = MetricsEndpoint(reader, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    finally:
        endpoint.stop()
    assert '# TYPE chainweaver_requests_total counter' in body
    assert 'chainweaver_requests_total{kind="tool",outcome="ok",name="product_search"} 1' \
        in body
    assert 'chainweaver_request_duration_seconds_bucket{kind="tool",outcome="ok",' \
           'name="product_search",le="+Inf"} 1' in body
    assert 'chainweaver_runs_total{tool="product_search",status="completed"} 1' in body
    assert body == prometheus_text(reader) or "chainweaver_steps_total" in body


def test_a_meter_without_the_bucket_advisory_still_gets_its_histograms() -> None:
    from chainweaver.mcp.runs.metrics import DURATION_BUCKETS, ServerMetrics

    reader = InMemoryMetricReader()
    real = MeterProvider(metric_readers=[reader]).get_meter("test")
    asked: list[dict[str, Any]] = []

    class OldMeter:  # an API before the advisory keyword (opentelemetry-api < 1.23)
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def create_histogram(self, name: str, unit: str = "", description: str = "",
                             **advice: Any) -> Any:
            asked.append(advice)
            if advice:
                raise TypeError("unexpected keyword argument")
            return real.create_histogram(name, unit, description)

    class OldProvider:
        def get_meter(self, *args: Any) -> OldMeter:
            return OldMeter()

    metrics = ServerMetrics(OldProvider())
    metrics.run_finished("product_search", "completed", 0.002)
    assert asked[:2] == [{"explicit_bucket_boundaries_advisory": DURATION_BUCKETS}, {}]
    (point,) = points(reader)["chainweaver.run.duration"]
    assert point.count == 1
