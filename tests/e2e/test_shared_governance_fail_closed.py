"""Shared governance fails closed, on a real Redis, when the version counter does not
tell the whole story: a decisions hash whose counter is missing (evicted under an
``allkeys-*`` memory policy, restored without it, written by hand), and a state that
changed under a counter that came back to the version a replica applied (a Redis
restored from an older snapshot, then changed as often again). A process must govern
by the decisions Redis holds, not by a version number that happens to match. And a
process told to stop serving when it cannot confirm the state (``stop_serving_after``)
that starts while Redis is unreachable has confirmed nothing: it serves no flow until
it can. A withdrawn flow answers like a name that never existed
(``support.views.assert_view``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from functools import partial

import pytest
from fastmcp import Client
from support import polling
from support.catalogue import build_catalogue
from support.redis_server import redis_server
from support.shared_governance import RestartableRedis
from support.views import OWNERS, assert_view

from chainweaver.governance import GovernanceSettings, GovernanceStore
from chainweaver.mcp import FlowServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.tasks]

until = partial(polling.until, limit=10.0)
WITHDRAWN = json.dumps({"all": "withdrawn", "versions": {}})


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def replica(governance: GovernanceSettings) -> FlowServer:
    return FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                      governance=governance)


def settings(url: str, **options: float) -> GovernanceSettings:
    return GovernanceSettings(url=url, prefix=f"test:{uuid.uuid4().hex}",
                              confirm_interval=0.2, heartbeat_interval=0.2, **options)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_decisions_without_a_version_counter_still_govern_a_starting_replica(
        redis_url: str, mode: str) -> None:
    """The decisions hash holds a withdrawal, the counter is gone: a replica started
    then served the withdrawn flow (version 0 read as "nothing to apply")."""
    governance = settings(redis_url)
    store = GovernanceStore(governance.url, governance.prefix)
    await store.change("order_status", None, "withdrawn", by="ops")
    await store.redis.delete(store.version_key)  # evicted, or never restored
    starting = replica(governance)
    async with Client(starting.fastmcp, mode=mode) as client:
        await assert_view(client, set(OWNERS) - {"order_status"})
    await store.aclose()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_reconnect_applies_decisions_that_changed_under_the_same_version(
        redis_url: str, mode: str) -> None:
    """A replica applied version N; its connection drops, and Redis then holds other
    decisions at the same version N (restored from an older snapshot and changed as
    often again). On reconnect it reads the whole state and must apply it: it kept
    serving the flow withdrawn meanwhile."""
    governance = settings(redis_url)
    store = GovernanceStore(governance.url, governance.prefix)
    first = await store.change("price_quote", None, "active", by="ops")
    running = replica(governance)
    async with Client(running.fastmcp, mode=mode) as client:
        await until(lambda: _applied(running, first.version), "the first change")
        await assert_view(client, set(OWNERS))
        # Another history reaching the same version, without this replica hearing it.
        async with store.redis.pipeline(transaction=True) as pipe:
            pipe.delete(store.decisions_key)
            pipe.hset(store.decisions_key, "order_status", WITHDRAWN)
            pipe.set(store.version_key, first.version)
            await pipe.execute()
        await store.redis.client_kill_filter(_type="pubsub")  # the replica reconnects
        await until(lambda: _reconnected(running), "the reconnect")
        await until(lambda: _withdrawn(running), "the reconnect's apply")
        await assert_view(client, set(OWNERS) - {"order_status"})
    await store.aclose()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_replica_started_in_an_outage_with_stop_serving_after_serves_nothing(
        mode: str) -> None:
    """``stop_serving_after`` asks for no flow once the state went unconfirmed that
    long. A replica started while Redis is down has confirmed no state at all: it
    served every flow as defined (the one operators withdrew included) for the whole
    bound. It serves none until it reads the state, then exactly what that allows."""
    redis = RestartableRedis()
    redis.start()
    try:
        governance = settings(redis.url, stop_serving_after=60.0)
        store = GovernanceStore(governance.url, governance.prefix)
        withdrawn = await store.change("order_status", None, "withdrawn", by="ops")
        await store.aclose()
        redis.stop()
        starting = replica(governance)
        async with Client(starting.fastmcp, mode=mode) as client:
            await assert_view(client, set())
            report = {e.flow_name: e for e in starting.exposure_report()}
            assert "stop_serving_after" in report["price_quote"].reason  # type: ignore[operator]
            redis.start()
            await until(lambda: _applied(starting, withdrawn.version), "the state")
            await assert_view(client, set(OWNERS) - {"order_status"})
    finally:
        redis.close()


async def _applied(server: FlowServer, version: int) -> bool:
    return server._shared.follower.version >= version  # type: ignore[union-attr]


async def _reconnected(server: FlowServer) -> bool:
    return server._shared.follower.last_outage is not None  # type: ignore[union-attr]


async def _withdrawn(server: FlowServer) -> bool:
    return "order_status" not in server.executor.registry.names()
