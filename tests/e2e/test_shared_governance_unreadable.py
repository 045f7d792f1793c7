"""Shared governance fails closed, on a real Redis: an entry a process cannot read (an
action a newer release wrote, a value that is not JSON, a key that is not a version)
withholds its flow on running replicas and on one started afterwards, while the other
entries keep applying and the heartbeat goes on; a version is reported only once every
entry of it was applied, and ``flows ... --wait`` names the processes that did not and
why; ``flows status`` shows what cannot be read; ``1.0`` and ``1.0.0`` are one version.
MCP clients are real (fastmcp, in memory); every withheld flow must answer in every
primitive exactly like a name that never existed (``support.views.assert_view``)."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator
from functools import partial

import anyio
import pytest
from fastmcp import Client
from support import polling
from support.catalogue import build_catalogue
from support.redis_server import redis_server
from support.views import OWNERS, assert_view

from chainweaver import Flow, FlowGovernance, FlowLifecycle, FlowStep
from chainweaver.cli import main
from chainweaver.governance import GovernanceSettings, GovernanceStore
from chainweaver.governance.state import UNREADABLE
from chainweaver.mcp import FlowServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.tasks]

# What another release, a hand edit or damage may leave in the decisions hash.
BAD_ENTRIES = {
    "unknown_action": b'{"all": "paused", "versions": {}}',
    "not_json": b"\x80 not json {",
    "bad_version_key": b'{"versions": {"1.0.0": "active", "2.x-final!": "archived"}}',
    # Deeper than Python's JSON decoder goes: RecursionError, not ValueError. It was
    # read as an outage, so a replica started then served every flow as defined.
    "nested_too_deep": b'{"all": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}
until = partial(polling.until, limit=10.0)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def settings(url: str, prefix: str) -> GovernanceSettings:
    return GovernanceSettings(url=url, prefix=prefix, confirm_interval=0.2,
                              heartbeat_interval=0.2)


def replica(governance: GovernanceSettings, **options: object) -> FlowServer:
    executor = build_catalogue()
    for flow in options.pop("extra", ()):  # type: ignore[attr-defined]
        executor.registry.register_flow(flow)
    return FlowServer(executor, expose_schemas=True, expose_prompts=True, **options,
                      governance=governance)  # type: ignore[arg-type]


def applied(server: FlowServer) -> int:
    return server._shared.follower.version  # type: ignore[union-attr]


def process(server: FlowServer) -> str:
    return server._shared.follower.process  # type: ignore[union-attr]


async def write_raw(store: GovernanceStore, name: str, raw: bytes) -> int:
    """An entry written as a newer release (or a hand edit) would: value, counter,
    message."""
    await store.redis.hset(store.decisions_key, name, raw)
    version = int(await store.redis.incr(store.version_key))
    await store.redis.publish(store.channel, f"{version} {name}")
    return version


async def cli(*argv: str) -> int:
    return await anyio.to_thread.run_sync(main, list(argv))


@pytest.mark.parametrize("kind", list(BAD_ENTRIES))
async def test_an_unreadable_entry_withholds_its_flow_on_running_and_starting_replicas(
        redis_url: str, kind: str, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.WARNING, logger="chainweaver.governance")
    governance = settings(redis_url, f"test:{uuid.uuid4().hex}")
    common = ["--governance", redis_url, "--prefix", governance.prefix]
    store = GovernanceStore(governance.url, governance.prefix)
    archived = await store.change("order_status", None, "archived", by="ops")
    running = replica(governance)
    async with Client(running.fastmcp) as old:
        await until(lambda: _at(archived.version, running), "the archive")
        await write_raw(store, "product_search", BAD_ENTRIES[kind])
        # The other entries keep applying: the running replica confirms this one.
        assert await cli("flows", "archive", "price_quote", "--wait", "5", *common) == 0
        out = capsys.readouterr().out
        assert "applied by 1 live process(es)" in out
        version = int(re.findall(r"shared version (\d+)", out)[0])
        assert applied(running) == version
        await assert_view(old, {"failing_flow"})  # withheld; the two archives applied
        report = {e.flow_name: e for e in running.exposure_report()}
        assert report["product_search"].reason.startswith(UNREADABLE)  # type: ignore[union-attr]
        beat = (await store.heartbeats())[process(running)]
        assert beat["version"] == version and beat["pending"] is None
        assert list(beat["unreadable"]) == ["product_search"]
        await until(lambda: _beats_after(store, running, beat["seen"]), "another heartbeat")

        # A replica started now never serves the withheld flow, nor an archived one.
        starting = replica(governance)
        async with Client(starting.fastmcp) as new:
            assert applied(starting) == version  # applied before it served
            await assert_view(new, {"failing_flow"})
            # An operator fixes the entry: both replicas are governed by it again.
            fixed = await store.change("product_search", None, "active", by="ops")
            await until(lambda: _at(fixed.version, running, starting), "the fix")
            await assert_view(old, {"product_search", "failing_flow"})
            await assert_view(new, {"product_search", "failing_flow"})
            result = await new.call_tool("product_search", {"query": "lamp"})
            assert not result.is_error
    await store.aclose()
    warned = [r.getMessage() for r in caplog.records
              if "'product_search' is not served" in r.getMessage()]
    assert len(warned) == 2  # once per replica, however many applies followed
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


async def _at(version: int, *servers: FlowServer) -> bool:
    return all(applied(server) >= version for server in servers)


async def _beats_after(store: GovernanceStore, server: FlowServer, seen: float) -> bool:
    return (await store.heartbeats())[process(server)]["seen"] > seen


async def test_a_partial_apply_is_not_reported_and_wait_says_who_and_why(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Activating this flow would publish its invocation prompt under the name of
    # product_search's authored prompt "compare": the replica cannot apply it.
    clash = Flow("product_search__compare", "Clashes.", [FlowStep("search_products")],
                 governance=FlowGovernance(FlowLifecycle.ARCHIVED))
    prefix = f"test:{uuid.uuid4().hex}"
    governance = settings(redis_url, prefix)
    common = ["--governance", redis_url, "--prefix", prefix]
    server = replica(governance, extra=[clash])
    async with Client(server.fastmcp) as client:
        await until(lambda: _beats(GovernanceStore(redis_url, prefix)), "a heartbeat")
        assert await cli("flows", "activate", "product_search__compare", "--wait", "1",
                         *common) == 1
        err = capsys.readouterr().err
        assert f"not applied by 1 of 1 live process(es):\n  {process(server)}: at version 0" \
            in err
        assert "could not apply product_search__compare" in err
        store = GovernanceStore(redis_url, prefix)
        beat = (await store.heartbeats())[process(server)]
        assert (beat["version"], beat["pending"]) == (0, 1)
        assert "collides" in beat["not_applied"]["product_search__compare"]
        await assert_view(client, set(OWNERS))  # the clash is withheld, nothing else moved
        assert "product_search__compare" not in {t.name for t in await client.list_tools()}
        report = {e.flow_name: e for e in server.exposure_report()}
        assert "could not be applied" in report["product_search__compare"].reason  # type: ignore[operator]
        assert await cli("flows", "status", *common) == 0
        table = capsys.readouterr().out
        assert "0 (read 1)" in table and "could not apply the decision on " \
            "product_search__compare" in table
        # Deciding it away makes the apply complete: reported, and --wait succeeds.
        assert await cli("flows", "archive", "product_search__compare", "--wait", "5",
                         *common) == 0
        assert "applied by 1 live process(es)" in capsys.readouterr().out
        beat = (await store.heartbeats())[process(server)]
        assert (beat["version"], beat["pending"], beat["not_applied"]) == (2, None, {})
        await store.aclose()


async def _beats(store: GovernanceStore) -> bool:
    try:
        return bool(await store.heartbeats())
    finally:
        await store.aclose()


async def test_wait_fails_naming_a_process_that_cannot_read_the_entry(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    governance = settings(redis_url, prefix)
    common = ["--governance", redis_url, "--prefix", prefix]
    store = GovernanceStore(redis_url, prefix)
    await write_raw(store, "price_quote", b'{"all": null, "versions": {}, "until": 5}')
    server = replica(governance)
    async with Client(server.fastmcp) as client:
        # A single-version decision keeps the newer release's field: still unreadable.
        assert await cli("flows", "deprecate", "price_quote", "--version", "1.0", "--wait",
                         "1", *common) == 1
        out, err = capsys.readouterr()
        assert "price_quote (version 1.0): deprecated; shared version 2" in out
        assert "warning: price_quote is withheld by shared governance" in err
        assert f"{process(server)}: withheld by shared governance: its entry cannot be " \
               f"read (unknown field(s) 'until'" in err
        assert "price_quote" not in {t.name for t in await client.list_tools()}
        # Without --version the decision replaces the entry.
        assert await cli("flows", "deprecate", "price_quote", "--wait", "5", *common) == 0
        assert "applied by 1 live process(es)" in capsys.readouterr().out
        listed = {t.name: t for t in await client.list_tools()}
        assert listed["price_quote"].description.startswith("Deprecated: ")
    await store.aclose()


async def test_wait_with_no_live_process_confirms_nothing(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    # --force: no process knows the name either (refused without it, see
    # test_shared_governance_redis.py); here the wait is what is tested.
    code = await cli("flows", "archive", "order_status", "--wait", "0.3", "--force",
                     "--governance", redis_url, "--prefix", prefix)
    assert code == 1
    assert "no live process reported" in capsys.readouterr().err


async def test_status_shows_what_cannot_be_read_instead_of_failing(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    common = ["--governance", redis_url, "--prefix", prefix]
    store = GovernanceStore(redis_url, prefix)
    names = {kind: f"flow_{kind}" for kind in BAD_ENTRIES}
    for kind, raw in BAD_ENTRIES.items():
        await write_raw(store, names[kind], raw)
    await store.change("order_status", "2.1", "deprecated", by="alice")
    await store.redis.hset(store.heartbeats_key, "web-9:1", b"\xff{")
    await store.redis.hset(store.heartbeats_key, "web-9:2", b"[" * 100_000 + b"]" * 100_000)
    assert await cli("flows", "status", "--json", *common) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["version"] == len(BAD_ENTRIES) + 1
    assert status["decisions"] == {"order_status": {"all": None,
                                                    "versions": {"2.1": "deprecated"}}}
    assert sorted(status["unreadable"]) == sorted(names.values())
    assert "'paused'" in status["unreadable"]["flow_unknown_action"]
    assert "not UTF-8" in status["unreadable"]["flow_not_json"]
    assert "'2.x-final!'" in status["unreadable"]["flow_bad_version_key"]
    assert "nested too deep" in status["unreadable"]["flow_nested_too_deep"]
    assert status["processes"]["web-9:1"]["live"] is False
    assert status["processes"]["web-9:2"]["live"] is False
    assert await cli("flows", "status", *common) == 0
    table = capsys.readouterr().out
    rows = {line.split()[0]: line.split(None, 2)[2] for line in table.splitlines()
            if line.startswith("flow_")}
    assert rows == {name: f"NOT SERVED: its entry cannot be read "
                          f"({status['unreadable'][name].partition(' (')[2]}"
                    for name in names.values()}
    assert "order_status" in table and "heartbeat unreadable (not JSON)" in table
    await store.aclose()


async def test_one_point_o_and_one_point_o_point_o_are_one_version_end_to_end(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    governance = settings(redis_url, prefix)
    common = ["--governance", redis_url, "--prefix", prefix]
    server = replica(governance)
    async with Client(server.fastmcp) as client:
        await until(lambda: _beats(GovernanceStore(redis_url, prefix)), "a heartbeat")
        assert await cli("flows", "deprecate", "order_status", "--version", "2.1",
                         "--wait", "5", *common) == 0
        listed = {t.name: t for t in await client.list_tools()}
        assert listed["order_status"].description.startswith("Deprecated: ")
        assert await cli("flows", "archive", "order_status", "--version", "2.1.0",
                         "--wait", "5", *common) == 0
        assert "applied by 1 live process(es)" in capsys.readouterr().out
        # 2.1.0 (the latest) archived: the flow is published no more.
        await assert_view(client, set(OWNERS) - {"order_status"})
        assert await cli("flows", "status", "--json", *common) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["decisions"] == {"order_status": {"all": None,
                                                        "versions": {"2.1.0": "archived"}}}
        assert await cli("flows", "activate", "order_status", "--version", "2.1.0.0",
                         "--wait", "5", *common) == 0
        await assert_view(client, set(OWNERS))


# The shared state as a whole cannot be read, while Redis answers: the counter is not a
# number, or a key holds another type (a hand edit, another program on the same Redis).
WHOLE_STATE_DAMAGE = {
    "counter_not_a_number": ("version", lambda redis, key: redis.set(key, "v7")),
    "decisions_not_a_hash": ("decisions", lambda redis, key: redis.set(key, "oops")),
}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("damage", list(WHOLE_STATE_DAMAGE))
async def test_a_replica_that_cannot_read_the_whole_state_serves_nothing_it_withdrew(
        redis_url: str, damage: str, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A replica started while the state cannot be read has applied none, so it cannot
    tell what operators withdrew: it serves no flow (it served every flow as defined,
    the archived one included) until the state can be read; a replica that applied a
    state keeps serving that one, as in an outage."""
    caplog.set_level(logging.WARNING, logger="chainweaver.governance")
    governance = settings(redis_url, f"test:{uuid.uuid4().hex}")
    store = GovernanceStore(governance.url, governance.prefix)
    archived = await store.change("order_status", None, "archived", by="ops")
    running = replica(governance)
    async with Client(running.fastmcp, mode=mode) as old:
        await until(lambda: _at(archived.version, running), "the archive")
        suffix, damaging = WHOLE_STATE_DAMAGE[damage]
        key = f"{governance.prefix}:{suffix}"
        saved = await store.redis.dump(key)
        await store.redis.delete(key)
        await damaging(store.redis, key)
        starting = replica(governance)
        async with Client(starting.fastmcp, mode=mode) as new:
            await assert_view(new, set())
            report = {e.flow_name: e for e in starting.exposure_report()}
            assert "cannot be read" in report["order_status"].reason  # type: ignore[operator]
            # The running replica keeps the state it applied.
            await assert_view(old, set(OWNERS) - {"order_status"})
            # Repaired: the new replica applies the state, the archive included.
            await store.redis.delete(key)
            await store.redis.restore(key, 0, saved)
            await store.redis.incr(governance.prefix + ":version")
            await until(lambda: _at(archived.version + 1, starting), "the repaired state")
            await assert_view(new, set(OWNERS) - {"order_status"})
    await store.aclose()
    logged = [r.getMessage() for r in caplog.records]
    assert any("cannot be read" in line and "serving no flow" in line for line in logged)

