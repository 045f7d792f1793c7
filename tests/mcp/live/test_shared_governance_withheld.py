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

from chainweaver.errors import ExposureConfigError
from chainweaver.governance import Decision, GovernanceOverlay, GovernanceSettings, SharedState
from chainweaver.governance.state import UNREADABLE, read_entry
from chainweaver.mcp import ExposurePolicy, FlowServer

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
    server = FlowServer(build_catalogue(), governance=url)
    async with Client(server.fastmcp) as client:
        assert await client.list_tools() == []  # it has read no state: it serves none
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "Redis unreachable at redis://ops:***@127.0.0.1:1/0 (ConnectionError" in logged
    assert "s3cret" not in logged


@pytest.mark.tasks  # the Redis client comes with the tasks extra
@pytest.mark.parametrize("url", ["redis://127.0.0.1:notaport/0",
                                 "redis://127.0.0.1:99999/0",
                                 "redis://ops:s3cret-pw@127.0.0.1:6379/0?socket_timeout=x"])
def test_a_governance_url_the_redis_client_cannot_read_is_refused_at_construction(
        url: str) -> None:
    """It used to be accepted: the follower died on it when the server started, so the
    process served every flow as defined (a withdrawn one included) and never stopped,
    ``stop_serving_after`` or not."""
    with pytest.raises(ExposureConfigError, match="governance URL .* cannot be used") as bad:
        FlowServer(build_catalogue(), governance=GovernanceSettings(
            url=url, stop_serving_after=0.5))
    assert "s3cret" not in str(bad.value)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_follower_that_cannot_build_its_store_serves_nothing(
        mode: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The store cannot even be built (here as without the Redis client, the tasks
    extra): the state was never read, so nothing is served, and the log says why. The
    follower used to die on it, leaving every flow served as defined."""
    from chainweaver.governance import store

    def no_client(self: object, *args: object, **kwargs: object) -> None:
        raise ImportError("No module named 'redis'")

    monkeypatch.setattr(store.GovernanceStore, "__init__", no_client)
    caplog.set_level(logging.ERROR, logger="chainweaver.governance")
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        governance="redis://127.0.0.1:1/0")
    async with Client(server.fastmcp, mode=mode) as client:
        await assert_view(client, set())
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "cannot be read (ImportError: No module named 'redis')" in logged
