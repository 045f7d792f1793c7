"""What shared governance withholds, seen by MCP clients (in memory, no Redis: the
overlay is applied directly): a flow whose shared entry cannot be read, and every flow
of a process that stopped serving, answer like names that never existed in every
primitive, on both eras and whatever the policy (``force_expose`` included); the
exposure report says why. Also: the follower's log never shows the Redis password."""

from __future__ import annotations

import logging

import pytest
from fastmcp import Client
from support.catalogue import build_catalogue
from support.views import OWNERS, assert_view

from chainweaver.governance import Decision, GovernanceOverlay, SharedState
from chainweaver.governance.state import UNREADABLE, read_entry
from chainweaver.mcp import ExposurePolicy, FlowServer, ServingConfig

MODES = ["auto", "legacy"]
FORCED = ExposurePolicy(flow_names=list(OWNERS), force_expose=True,
                        allowed_side_effects=["none", "read", "write", "external",
                                              "destructive"],
                        allow_requires_approval=True)


def governed_server(policy: ExposurePolicy | None) -> tuple[FlowServer, GovernanceOverlay]:
    executor = build_catalogue()
    overlay = GovernanceOverlay(executor.registry)  # before the server, as a replica's
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True, policy=policy)
    return server, overlay


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", [None, FORCED], ids=["default", "force_expose"])
async def test_a_flow_whose_entry_cannot_be_read_is_served_in_no_primitive(
        mode: str, policy: ExposurePolicy | None) -> None:
    server, overlay = governed_server(policy)
    overlay.apply(SharedState(1, {"product_search": read_entry('{"all": "paused"}'),
                                  "price_quote": Decision(all="deprecated")}))
    async with Client(server.fastmcp, mode=mode) as client:
        await assert_view(client, set(OWNERS) - {"product_search"})
        listed = {tool.name: tool for tool in await client.list_tools()}
        assert listed["price_quote"].description.startswith("Deprecated: ")  # applied
        overlay.apply(SharedState(2, {"product_search": Decision(all="active")}))
        await assert_view(client, set(OWNERS))  # fixed by an operator: served again
    entry = next(e for e in server.exposure_report() if e.flow_name == "product_search")
    assert entry.exposed


def test_the_exposure_report_says_the_entry_cannot_be_read() -> None:
    server, overlay = governed_server(FORCED)
    overlay.apply(SharedState(1, {"product_search": read_entry("not json")}))
    entry = next(e for e in server.exposure_report() if e.flow_name == "product_search")
    assert (entry.exposed, entry.forced) == (False, False)
    assert entry.reason == f"{UNREADABLE} (not JSON)"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_suspended_process_serves_nothing_even_under_force_expose(mode: str) -> None:
    server, overlay = governed_server(FORCED)
    overlay.suspend()  # stop_serving_after ran out
    async with Client(server.fastmcp, mode=mode) as client:
        await assert_view(client, set())
        overlay.resume()
        await assert_view(client, set(OWNERS))
    assert all(e.exposed for e in server.exposure_report() if e.flow_name in OWNERS)


@pytest.mark.anyio
@pytest.mark.tasks  # the Redis client comes with the tasks extra
async def test_the_follower_log_masks_the_redis_password(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="chainweaver.governance")
    url = "redis://ops:s3cret-pw@127.0.0.1:1/0"  # nothing listens on port 1
    server = FlowServer(build_catalogue(), serving=ServingConfig(governance=url))
    async with Client(server.fastmcp) as client:
        assert {tool.name for tool in await client.list_tools()} >= {"order_status"}
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "Redis unreachable at redis://ops:***@127.0.0.1:1/0 (ConnectionError" in logged
    assert "s3cret" not in logged
