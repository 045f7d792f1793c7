"""Shared governance fails closed, on a real Redis, when the version counter does not
tell the whole story: a decisions hash whose counter is missing (evicted under an
``allkeys-*`` memory policy, restored without it, written by hand), and a state that
changed under a counter that came back to the version a replica applied (a Redis
restored from an older snapshot, then changed as often again). A process must govern
by the decisions Redis holds, not by a version number that happens to match. And a
process that starts while Redis is unreachable has read no state: it serves no flow
until it can. A withdrawn flow answers like a name that never existed
(``support.views.assert_view``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from functools import partial

import anyio
import pytest
from fastmcp import Client
from support import polling
from support.catalogue import build_catalogue
from support.redis_server import redis_server
from support.shared_governance import RestartableRedis
from support.views import OWNERS, assert_view

from chainweaver.cli import main
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
async def test_decisions_missing_under_a_counter_that_moved_fail_closed(
        redis_url: str, mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The counter says operators decided (it only ever grows with decisions, and no
    command removes one), but the decisions hash is gone: evicted (an ``allkeys-*``
    memory policy evicts the hash, read only on changes, before the counter every
    replica polls), or not restored with it. Read as "nothing decided", it served the
    withdrawn flow again on a replica that reconnected and on one that started. The
    state cannot be read: a replica keeps the state it applied, one that applied none
    serves nothing, until operators decide again."""
    governance = settings(redis_url)
    store = GovernanceStore(governance.url, governance.prefix)
    withdrawn = await store.change("order_status", None, "withdrawn", by="ops")
    running = replica(governance)
    async with Client(running.fastmcp, mode=mode) as old:
        await until(lambda: _applied(running, withdrawn.version), "the withdrawal")
        await store.redis.delete(store.decisions_key)  # evicted
        await store.redis.publish(store.channel, "0 nothing")  # the replica re-reads
        await until(lambda: _reread(running), "the replica to read the state again")
        starting = replica(governance)
        async with Client(starting.fastmcp, mode=mode) as new:
            await assert_view(new, set())
            report = {e.flow_name: e for e in starting.exposure_report()}
            assert "cannot be read" in report["price_quote"].reason  # type: ignore[operator]
            await assert_view(old, set(OWNERS) - {"order_status"})
            # Status says why; operators decide again (the command still knows the
            # name from the live processes), and both replicas apply the state.
            common = ["--governance", governance.url, "--prefix", governance.prefix]
            assert await cli("flows", "status", *common) == 2
            assert "no decision is stored" in capsys.readouterr().err
            assert await cli("flows", "withdraw", "order_status", *common) == 0
            again = await store.current_version()
            await until(lambda: _applied(starting, again), "the new decision")
            await until(lambda: _applied(running, again), "the new decision")
            await assert_view(new, set(OWNERS) - {"order_status"})
            await assert_view(old, set(OWNERS) - {"order_status"})
    await store.aclose()


@pytest.mark.parametrize("stop_serving_after", [None, 60.0])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_replica_started_in_an_outage_serves_nothing_until_it_reads_the_state(
        mode: str, stop_serving_after: float | None) -> None:
    """A replica started while Redis is down has read no state at all: its definitions
    never had an operator's decision applied. It served every flow as defined (the one
    operators withdrew included) until Redis came back, for the whole bound under
    ``stop_serving_after`` and for good without it. It serves none until it reads the
    state, then exactly what that allows."""
    redis = RestartableRedis()
    redis.start()
    try:
        options = {} if stop_serving_after is None else \
            {"stop_serving_after": stop_serving_after}
        governance = settings(redis.url, **options)
        store = GovernanceStore(governance.url, governance.prefix)
        withdrawn = await store.change("order_status", None, "withdrawn", by="ops")
        await store.aclose()
        redis.stop()
        starting = replica(governance)
        async with Client(starting.fastmcp, mode=mode) as client:
            await assert_view(client, set())
            report = {e.flow_name: e for e in starting.exposure_report()}
            assert "has not read the shared state yet" in report["price_quote"].reason  # type: ignore[operator]
            redis.start()
            await until(lambda: _applied(starting, withdrawn.version), "the state")
            await assert_view(client, set(OWNERS) - {"order_status"})
    finally:
        redis.close()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_starting_replica_that_fails_reading_the_state_serves_nothing(
        redis_url: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis answers, but this process fails on what it read for a reason no one
    foresaw (here: its reader raises). That is a state it cannot read, not an outage,
    and what governance withdrew is unknown: it serves no flow until a read succeeds
    (as when Redis cannot be reached at all)."""
    governance = settings(redis_url)
    store = GovernanceStore(governance.url, governance.prefix)
    withdrawn = await store.change("order_status", None, "withdrawn", by="ops")
    read = GovernanceStore.read

    async def failing(self: GovernanceStore) -> object:
        raise RuntimeError("a reader that fails")

    monkeypatch.setattr(GovernanceStore, "read", failing)
    starting = replica(governance)
    async with Client(starting.fastmcp, mode=mode) as client:
        await assert_view(client, set())
        report = {e.flow_name: e for e in starting.exposure_report()}
        assert "cannot be read" in report["price_quote"].reason  # type: ignore[operator]
        monkeypatch.setattr(GovernanceStore, "read", read)  # reads again, and applies
        await until(lambda: _applied(starting, withdrawn.version), "the state")
        await assert_view(client, set(OWNERS) - {"order_status"})
    await store.aclose()


async def cli(*argv: str) -> int:
    return await anyio.to_thread.run_sync(main, list(argv))


async def _applied(server: FlowServer, version: int) -> bool:
    return server._shared.follower.version >= version  # type: ignore[union-attr]


async def _reconnected(server: FlowServer) -> bool:
    return server._shared.follower.last_outage is not None  # type: ignore[union-attr]


async def _reread(server: FlowServer) -> bool:
    """It read the state: found it unreadable (an outage), or applied what it read."""
    follower = server._shared.follower  # type: ignore[union-attr]
    return follower.outage_since is not None or "order_status" in \
        server.executor.registry.names()


async def _withdrawn(server: FlowServer) -> bool:
    return "order_status" not in server.executor.registry.names()
