"""Flow runs started as background tasks count in ``chainweaver.runs`` and
``chainweaver.steps`` like inline ones: the published tool name and the fixed status
vocabularies, a completed and a failed task alike (in-memory tasks backend). A server
mounted with ``mount_into`` counts its requests under its own published names."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from mcp import MCPError
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.catalogue import build_catalogue

from chainweaver.mcp import CallerIdentity, FlowServer, SecurityConfig
from chainweaver.mcp.runs.metrics import RUN_STATUSES, STEP_STATUSES, UNPUBLISHED

LIMIT = 10.0  # seconds: only to stop a hang


def counts(reader: InMemoryMetricReader, metric: str) -> dict[tuple[str, ...], Any]:
    data = reader.get_metrics_data()
    found: dict[tuple[str, ...], Any] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for instrument in scope.metrics:
                if instrument.name == metric:
                    for point in instrument.data.data_points:
                        key = tuple(sorted(point.attributes.items()))
                        found[key] = getattr(point, "value", None) \
                            if hasattr(point, "value") else point.count
    return found


@pytest.mark.tasks
@pytest.mark.anyio
async def test_completed_and_failed_tasks_count_their_runs_and_steps() -> None:
    from fastmcp_tasks import call_tool_task  # the tasks extra

    reader = InMemoryMetricReader()
    server = FlowServer(build_catalogue(), tasks="memory://",
                        meter_provider=MeterProvider(metric_readers=[reader]))
    async with Client(server.fastmcp) as client:
        done = await call_tool_task(client, "product_search", {"query": "lamp"})
        assert not (await asyncio.wait_for(done.result(), LIMIT)).is_error
        failing = await call_tool_task(client, "failing_flow", {"query": "x"},
                                       raise_on_error=False)
        assert (await asyncio.wait_for(failing.result(), LIMIT)).is_error
    runs = counts(reader, "chainweaver.runs")
    assert runs == {(("status", "completed"), ("tool", "product_search")): 1,
                    (("status", "failed"), ("tool", "failing_flow")): 1}
    timed = counts(reader, "chainweaver.run.duration")
    assert set(timed) == set(runs) and set(timed.values()) == {1}
    steps = counts(reader, "chainweaver.steps")
    assert steps[(("status", "completed"), ("tool", "product_search"))] >= 1
    assert steps[(("status", "failed"), ("tool", "failing_flow"))] >= 1
    for labels in (*runs, *steps):
        assert dict(labels)["tool"] in server.registered_tool_names
        assert dict(labels)["status"] in RUN_STATUSES | STEP_STATUSES
    # Each run is counted once: the tools/call that created the task ran nothing.
    requests = counts(reader, "chainweaver.requests")
    assert requests[(("kind", "tool"), ("name", "product_search"), ("outcome", "ok"))] == 1


@pytest.mark.tasks
@pytest.mark.anyio
async def test_a_task_whose_input_is_invalid_counts_no_run() -> None:
    from fastmcp_tasks import call_tool_task  # the tasks extra

    reader = InMemoryMetricReader()
    server = FlowServer(build_catalogue(), tasks="memory://",
                        meter_provider=MeterProvider(metric_readers=[reader]))
    async with Client(server.fastmcp) as client:
        task = await call_tool_task(client, "product_search", {"query": 5},
                                    raise_on_error=False)
        assert (await asyncio.wait_for(task.result(), LIMIT)).is_error
    assert counts(reader, "chainweaver.runs") == {}


@pytest.mark.anyio
@pytest.mark.parametrize("namespace", [None, "cat"])
async def test_a_mounted_server_counts_its_requests_under_its_own_names(
        namespace: str | None) -> None:
    reader = InMemoryMetricReader()
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(
                            authenticator=lambda ctx: CallerIdentity("someone"),
                            authorizer=lambda gate: gate.flow_name != "order_status"),
                        meter_provider=MeterProvider(metric_readers=[reader]))
    parent = FastMCP("parent")

    @parent.tool
    def own(x: int) -> int:
        return x

    server.mount_into(parent, namespace=namespace)
    prefix = f"{namespace}_" if namespace else ""
    index = f"chainweaver://{namespace}/flows" if namespace else "chainweaver://flows"
    async with Client(parent) as client:
        await client.list_tools()
        await client.call_tool(f"{prefix}product_search", {"query": "lamp"})
        await client.read_resource(index)
        await client.get_prompt(f"{prefix}chainweaver_guide")
        await client.call_tool("own", {"x": 1})  # the parent's: not this server's to count
        with pytest.raises(MCPError):
            await client.call_tool(f"{prefix}order_status", {"order_id": "A-1"})
    requests = counts(reader, "chainweaver.requests")
    served = {(dict(k)["kind"], dict(k)["outcome"], dict(k)["name"]): v
              for k, v in requests.items() if dict(k)["outcome"] != "refused"}
    assert served == {("list", "ok", "tools/list"): 1, ("tool", "ok", "product_search"): 1,
                      ("resource", "ok", "chainweaver://flows"): 1,
                      ("prompt", "ok", "chainweaver_guide"): 1}
    refused = [dict(k)["name"] for k in requests if dict(k)["outcome"] == "refused"]
    # A refusal is counted by the gate under the name the parent's client sent: only
    # names that resolve to this server's components reach it, so still bounded.
    assert refused == [f"{prefix}order_status"] and UNPUBLISHED not in refused
    runs = counts(reader, "chainweaver.runs")
    assert runs == {(("status", "completed"), ("tool", "product_search")): 1}
