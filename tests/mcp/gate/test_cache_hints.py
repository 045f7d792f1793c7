"""Caching hints (``ttlMs``, ``cacheScope``) on 2026-07-28 lists and reads: private
wherever the answer depends on the caller's view, public only when every caller gets
the same; a TTL no longer than ``Discovery.cache_ttl`` and the shared state's hold;
nothing on 2025-11-25 answers; and nothing in them that moves with a flow outside the
view."""

from __future__ import annotations

import logging
import time
from typing import Any

import mcp_types
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.transforms import Namespace
from support.catalogue import build_catalogue
from support.mcp_client import RawResult

from chainweaver.flows import Flow
from chainweaver.governance import GovernanceSettings, SharedGovernance
from chainweaver.mcp import Discovery, FlowServer, RunHistory, SecurityConfig, fastmcp_seams
from chainweaver.mcp.gate.cache_hints import CachePolicy
from chainweaver.mcp.hooks import CallerIdentity

SCHEMA = "chainweaver://flows/product_search/schema"
LISTS = ("tools/list", "prompts/list", "resources/list")


def search_team_only(caller: CallerIdentity, flow: Flow) -> bool:
    return flow.governance.owner == "search-team"


async def raw(client: Client, method: str, params: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    """A request's result as the wire carried it."""
    request = mcp_types.Request[dict[str, Any], str](method=method, params=params or {})
    result = await client.session.send_request(request, RawResult)
    return result.model_dump(by_alias=True)


def hints(result: dict[str, Any]) -> tuple[Any, Any]:
    return result.get("ttlMs"), result.get("cacheScope")


@pytest.mark.anyio
async def test_answers_that_depend_on_the_view_are_private() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(visible=search_team_only),
                        discovery=Discovery(cache_ttl=30))
    async with Client(server.fastmcp) as client:
        for method in LISTS:
            assert hints(await raw(client, method)) == (30_000, "private"), method
        assert hints(await raw(client, "resources/read", {"uri": SCHEMA})) == \
            (30_000, "private")
        # The templates describe the server, not a view.
        assert hints(await raw(client, "resources/templates/list")) == (30_000, "public")


@pytest.mark.anyio
async def test_answers_every_caller_shares_are_public() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    async with Client(server.fastmcp) as client:
        for method in LISTS:
            assert hints(await raw(client, method)) == (0, "public"), method
        assert hints(await raw(client, "resources/read", {"uri": SCHEMA})) == (0, "public")


@pytest.mark.anyio
async def test_a_run_record_read_is_private_even_on_a_shared_server() -> None:
    server = FlowServer(build_catalogue(), discovery=Discovery(cache_ttl=5),
                        run_history=RunHistory())
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("product_search", {"query": "lamp"})
        run = f"chainweaver://runs/{result.meta['chainweaver']['run_id']}"
        assert hints(await raw(client, "resources/read", {"uri": run})) == (5_000, "private")
        assert hints(await raw(client, "tools/list")) == (5_000, "public")


def composed(how: str) -> tuple[FastMCP, str]:
    """A shared server with run history (no auth, no hooks: its lists are public),
    composed ``how``; the FastMCP its clients talk to and the prefix of its names."""
    server = FlowServer(build_catalogue(), expose_schemas=True,
                        discovery=Discovery(cache_ttl=5), run_history=RunHistory())
    if how == "namespace":
        server.fastmcp.add_transform(Namespace("shop"))
        return server.fastmcp, "shop"
    # Mounted into another shared FlowServer, whose own hints answer the parent's
    # clients; "gw": a namespace on that parent too.
    parent = FlowServer(build_catalogue(), discovery=Discovery(cache_ttl=5)).fastmcp
    server.mount_into(parent, namespace="shop")
    if how == "mount_into, parent namespaced":
        parent.add_transform(Namespace("gw"))
        return parent, "gw/shop"
    return parent, "shop"


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["namespace", "mount_into",
                                 "mount_into, parent namespaced"])
async def test_a_run_record_read_is_private_under_every_composition(how: str) -> None:
    target, prefix = composed(how)
    tool = f"{prefix.replace('/', '_')}_product_search"
    async with Client(target) as client:
        result = await client.call_tool(tool, {"query": "lamp"})
        runs = f"chainweaver://{prefix}/runs"
        run = f"{runs}/{result.meta['chainweaver']['run_id']}"
        assert hints(await raw(client, "resources/read", {"uri": run})) == \
            (5_000, "private")
        assert hints(await raw(client, "resources/read", {"uri": runs})) == \
            (5_000, "private")
        # What every caller shares stays public under the composition.
        schema = f"chainweaver://{prefix}/flows/product_search/schema"
        assert hints(await raw(client, "resources/read", {"uri": schema})) == \
            (5_000, "public")
        assert hints(await raw(client, "tools/list")) == (5_000, "public")


@pytest.mark.anyio
async def test_2025_11_25_answers_carry_no_hints() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(visible=search_team_only),
                        discovery=Discovery(cache_ttl=30))
    async with Client(server.fastmcp, mode="legacy") as client:
        for method in (*LISTS, "resources/templates/list"):
            result = await raw(client, method)
            assert "ttlMs" not in result and "cacheScope" not in result, method
        read = await raw(client, "resources/read", {"uri": SCHEMA})
        assert "ttlMs" not in read and "cacheScope" not in read


@pytest.mark.anyio
async def test_a_change_outside_the_view_leaves_the_hints_alone() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True,
                        security=SecurityConfig(visible=search_team_only),
                        discovery=Discovery(cache_ttl=30))
    async with Client(server.fastmcp) as client:
        before = await raw(client, "tools/list")
        server.executor.registry.set_lifecycle("order_status", "archived")
        after = await raw(client, "tools/list")
    assert after == before


def test_the_ttl_never_outlasts_the_shared_state() -> None:
    assert CachePolicy(30).ttl_ms() == 30_000
    assert CachePolicy(0.5).ttl_ms() == 500
    assert CachePolicy(30, hold=lambda: 2.25).ttl_ms() == 2_250
    assert CachePolicy(30, hold=lambda: None).ttl_ms() == 30_000
    assert CachePolicy(30, hold=lambda: -1.0).ttl_ms() == 0
    assert CachePolicy(0, hold=lambda: 10.0).ttl_ms() == 0
    follower = SharedGovernance(GovernanceSettings("redis://127.0.0.1:1/0",
                                                   stop_serving_after=10.0),
                                build_catalogue().registry)
    assert follower.sure_for() == 0.0  # never confirmed: nothing is sure
    follower.confirmed = time.monotonic() - 4.0
    assert 5.5 < (follower.sure_for() or 0) <= 6.0
    unbounded = SharedGovernance(GovernanceSettings("redis://127.0.0.1:1/0"),
                                 build_catalogue().registry)
    assert unbounded.sure_for() == 0.0  # it serves nothing before it reads the state
    unbounded.confirmed = time.monotonic()
    assert unbounded.sure_for() is None


@pytest.mark.anyio
async def test_a_moved_sdk_middleware_list_keeps_the_sdks_own_hints(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="chainweaver.mcp.fastmcp_seams")
    monkeypatch.setattr(fastmcp_seams, "SDK_MIDDLEWARE", "_moved_in_a_new_release")
    monkeypatch.setattr(fastmcp_seams, "_warned", set())
    server = FlowServer(build_catalogue(), discovery=Discovery(cache_ttl=30))
    async with Client(server.fastmcp) as client:
        assert hints(await raw(client, "tools/list")) == (0, "private")
        assert len(await client.list_tools()) == 4
    assert any("middleware list" in record.getMessage() for record in caplog.records)
