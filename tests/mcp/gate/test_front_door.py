"""One front door: a request is pinned, admitted and served with each room on its way
entered once, its request metrics and run span finished by plain calls at the end of
serving rather than by wrappers that call back into it.

Counted with a profiler hook over the gate's own code (distinct frames per function:
a coroutine resumed after an await is the same frame), with metrics and tracing both
recording so every optional step is on the path; through a real MCP client in memory
on both eras, standing alone, under a ``Namespace`` and mounted with ``mount_into``.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.transforms import Namespace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.catalogue import build_catalogue
from support.spans import recorded_spans

from chainweaver.mcp import FlowServer, SecurityConfig

MODES = ["auto", "legacy"]
GATE = Path(__file__).resolve().parents[3] / "chainweaver" / "mcp" / "gate"
# The rooms a request walks through in the gate; every function there is counted.
ROOMS = {str(GATE / "front_door.py"), str(GATE / "serving.py"), str(GATE / "security.py")}


class Entries:
    """Distinct frames per gate function while requests run (one per entry)."""

    def __init__(self) -> None:
        self.frames: list[FrameType] = []  # kept, so no frame's id is reused

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename in ROOMS \
                and not any(frame is seen for seen in self.frames):
            self.frames.append(frame)

    def counted(self) -> Counter[str]:
        return Counter(f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_qualname}"
                       for frame in self.frames)


async def entries_of(request: Callable[[], Awaitable[Any]]) -> Counter[str]:
    entries = Entries()
    sys.setprofile(entries)
    try:
        await request()
    finally:
        sys.setprofile(None)
    return entries.counted()


def served() -> tuple[FlowServer, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(audit_hook=lambda event: None),
                        meter_provider=MeterProvider(metric_readers=[reader]))
    return server, reader


def requests_counted(reader: InMemoryMetricReader) -> dict[str, int]:
    data = reader.get_metrics_data()
    found: dict[str, int] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "chainweaver.requests":
                    for point in metric.data.data_points:
                        kind = str(point.attributes["kind"])
                        found[kind] = found.get(kind, 0) + point.value
    return found


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("namespaced", [False, True])
async def test_each_room_is_entered_once_per_call_read_and_render(
        mode: str, namespaced: bool) -> None:
    server, reader = served()
    if namespaced:
        server.fastmcp.add_transform(Namespace("shop"))
    tool = "shop_product_search" if namespaced else "product_search"
    prompt = "shop_chainweaver_guide" if namespaced else "chainweaver_guide"
    uri = "chainweaver://shop/flows" if namespaced else "chainweaver://flows"
    with recorded_spans() as spans:
        async with Client(server.fastmcp, mode=mode) as client:
            await client.call_tool(tool, {"query": "lamp"})  # warm: first-use work
            requests: dict[str, Callable[[], Awaitable[Any]]] = {
                "tool": lambda: client.call_tool(tool, {"query": "lamp"}),
                "resource": lambda: client.read_resource(uri),
                "prompt": lambda: client.get_prompt(prompt),
            }
            for kind, request in requests.items():
                entered = await entries_of(request)
                assert entered["serving.AdmittedServing.serve"] == 1, (kind, entered)
                assert entered["front_door.FrontDoor.__call__"] == 1, (kind, entered)
                assert entered["security.SecurityGate.guard_target"] == 1, (kind, entered)
                twice = {name: count for name, count in entered.items() if count > 1}
                # Audited twice by design: the decision, then how it completed.
                assert twice == {"security.SecurityGate._audit": 2}, (kind, twice)
        flow_spans = [span for span in spans.get_finished_spans()
                      if span.name == "chainweaver.flow product_search"]
    # The optional steps were on the path: both calls timed, both runs spanned.
    assert len(flow_spans) == 2
    counted = requests_counted(reader)
    counted.pop("list", None)  # the client lists the tools once, for their schemas
    assert counted == {"tool": 2, "resource": 1, "prompt": 1}


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_mounted_call_is_served_once_and_counted_once(mode: str) -> None:
    server, reader = served()
    parent = FastMCP("parent")
    server.mount_into(parent, namespace="shop")
    with recorded_spans() as spans:
        async with Client(parent, mode=mode) as client:
            await client.call_tool("shop_product_search", {"query": "lamp"})
            entered = await entries_of(
                lambda: client.call_tool("shop_product_search", {"query": "lamp"}))
        flow_spans = [span for span in spans.get_finished_spans()
                      if span.name == "chainweaver.flow product_search"]
    # The parent's MountedGate admits and serves it; the server's own chain counts it.
    assert entered["serving.AdmittedServing.serve"] == 1, entered
    assert entered["serving.AdmittedServing.count"] == 1, entered
    assert entered["security.SecurityGate.guard_target"] == 1, entered
    assert len(flow_spans) == 2
    counted = requests_counted(reader)
    counted.pop("list", None)
    assert counted == {"tool": 2}
