"""Shared governance on a real Redis, in one process: two FlowServers stand for two
replicas (each its own registry), clients of both eras follow each, and an operator's
change reaches exactly the clients whose view it is in, on both. Also: a missed
message is caught by the version check, an outage keeps (or, when asked, stops)
serving and re-synchronises, and the ``chainweaver flows`` command audits and reports."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial

import anyio
import pytest
from fastmcp import Client
from support import polling
from support.catalogue import build_catalogue
from support.notices import PROMPTS, RESOURCES, TOOLS, Heard, listening
from support.redis_server import redis_server
from support.shared_governance import RestartableRedis

from chainweaver.cli import main
from chainweaver.errors import ExposureConfigError
from chainweaver.governance import GovernanceSettings, GovernanceStore
from chainweaver.mcp import (
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    visible_claim,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.tasks]
TEAMS = {"sam": ["search-team", "common"], "olga": ["orders-team", "pricing-team", "common"]}


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def settings(url: str, prefix: str, **options: float) -> GovernanceSettings:
    return GovernanceSettings(url=url, prefix=prefix, confirm_interval=0.2,
                              heartbeat_interval=0.2, **options)


class Switch:
    """The caller of the next client's requests (in memory there are no tokens). A
    request context it is asked about again (a listener's, when there is news) names
    the caller it named then, as the credentials in its headers would."""

    def __init__(self) -> None:
        self.who = "sam"
        self.asked: list[tuple[GateContext, str]] = []

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        who = next((who for seen, who in self.asked if seen is ctx), None)
        if who is None:
            who = self.who
            self.asked.append((ctx, who))
        return CallerIdentity(who, {"teams": TEAMS[who]}, subject=who)


def replica(governance: GovernanceSettings, views: bool = True
            ) -> tuple[FlowServer, Switch]:
    switch = Switch()
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(
                            authenticator=switch,
                            visible=visible_claim("teams") if views else None),
                        governance=governance)
    return server, switch


@asynccontextmanager
async def client(server: FlowServer, switch: Switch, who: str, mode: str
                 ) -> AsyncIterator[tuple[Client, Heard]]:
    heard = Heard()
    switch.who = who
    if mode == "legacy":
        async with Client(server.fastmcp, mode="legacy", message_handler=heard) as legacy:
            await legacy.list_tools()  # the session is admitted as ``who``
            yield legacy, heard
        return
    async with Client(server.fastmcp) as modern, listening(modern.session, heard, []):
        yield modern, heard


async def tools(connected: Client, switch: Switch, who: str) -> set[str]:
    switch.who = who
    return {tool.name for tool in await connected.list_tools()}


until = partial(polling.until, limit=6.0)


def applied(server: FlowServer) -> int:
    return server._shared.follower.version  # type: ignore[union-attr]


async def test_a_change_reaches_every_replica_and_only_the_callers_it_concerns(
        redis_url: str) -> None:
    governance = settings(redis_url, f"test:{uuid.uuid4().hex}")
    store = GovernanceStore(governance.url, governance.prefix)
    (a, switch_a), (b, switch_b) = replica(governance), replica(governance)
    async with AsyncExitStack() as stack:
        followers = {}
        for name, (server, switch) in {"a": (a, switch_a), "b": (b, switch_b)}.items():
            for who, mode in (("sam", "legacy"), ("olga", "auto")) if name == "a" else \
                    (("sam", "auto"), ("olga", "legacy")):
                followers[name, who] = await stack.enter_async_context(
                    client(server, switch, who, mode))
        change = await store.change("product_search", None, "archived", by="alice")
        await until(lambda: _at(a, b, change.version), "both replicas to apply it")
        for name, who in followers:  # sam sees product_search; olga does not
            _, heard = followers[name, who]
            expected = sorted([TOOLS, RESOURCES, PROMPTS]) if who == "sam" else []
            assert await heard.take(len(expected)) == expected, (name, who)
        for (name, who), (connected, _) in followers.items():
            switch = switch_a if name == "a" else switch_b
            visible = await tools(connected, switch, who)
            assert "product_search" not in visible
        change = await store.change("product_search", None, "active", by="alice")
        await until(lambda: _at(a, b, change.version), "the activation")
        connected, heard = followers["a", "sam"]
        assert "product_search" in await tools(connected, switch_a, "sam")
        assert TOOLS in await heard.take(1)
        assert await followers["b", "olga"][1].take(0) == []
    await store.aclose()


async def _at(a: FlowServer, b: FlowServer, version: int) -> bool:
    return applied(a) >= version and applied(b) >= version


async def test_a_missed_message_is_caught_by_the_version_check(redis_url: str) -> None:
    governance = settings(redis_url, f"test:{uuid.uuid4().hex}")
    store = GovernanceStore(governance.url, governance.prefix)
    server, switch = replica(governance, views=False)
    async with client(server, switch, "sam", "auto") as (connected, heard):
        await until(lambda: _ready(server), "the first sync")
        # What a lost message looks like: the state and counter change, nothing published.
        await store.redis.hset(store.decisions_key, "order_status", json.dumps(
            {"all": "archived", "versions": {}}))
        await store.redis.incr(store.version_key)
        await until(lambda: _flow_gone(connected, switch), "the confirmation to catch it")
        assert TOOLS in await heard.take(1)
    await store.aclose()


async def _ready(server: FlowServer) -> bool:
    return server._shared.follower.confirmed is not None  # type: ignore[union-attr]


async def _flow_gone(connected: Client, switch: Switch) -> bool:
    return "order_status" not in await tools(connected, switch, "sam")


async def test_an_outage_keeps_serving_or_stops_when_asked_and_resyncs() -> None:
    redis = RestartableRedis()
    redis.start()
    try:
        prefix = f"test:{uuid.uuid4().hex}"
        keeps, keeps_switch = replica(settings(redis.url, prefix), views=False)
        stops, stops_switch = replica(settings(redis.url, prefix, stop_serving_after=0.5),
                                      views=False)
        async with client(keeps, keeps_switch, "sam", "auto") as (kept, _), \
                client(stops, stops_switch, "sam", "legacy") as (stopped, told):
            everything = await tools(kept, keeps_switch, "sam")
            store = GovernanceStore(redis.url, prefix)
            change = await store.change("price_quote", None, "archived", by="ops")
            await store.aclose()
            await until(lambda: _at(keeps, stops, change.version), "the archive")
            redis.stop()
            await until(lambda: _suspended(stops), "the replica that must stop to stop")
            assert await tools(stopped, stops_switch, "sam") == set()
            assert await tools(kept, keeps_switch, "sam") == everything - {"price_quote"}
            result = await kept.call_tool("order_status", {"order_id": "A-1"})
            assert result.structured_content["order_id"] == "A-1"
            redis.start()
            await until(lambda: _recovered(keeps, stops), "both to re-synchronise")
            for connected, switch in ((kept, keeps_switch), (stopped, stops_switch)):
                assert await tools(connected, switch, "sam") == everything - {"price_quote"}
            assert applied(keeps) == applied(stops) == change.version  # nothing else
            assert TOOLS in await told.take(1)
            store = GovernanceStore(redis.url, prefix)
            beats = await store.heartbeats()
            await store.aclose()
            assert all(beat["last_outage"] is not None for beat in beats.values())
    finally:
        redis.close()


async def _suspended(server: FlowServer) -> bool:
    return server._shared.follower.overlay.suspended  # type: ignore[union-attr]


async def _recovered(*servers: FlowServer) -> bool:
    return all(s._shared.follower.outage_since is None  # type: ignore[union-attr]
               and not s._shared.follower.overlay.suspended  # type: ignore[union-attr]
               for s in servers)


async def test_the_flows_command_changes_waits_and_reports(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    governance = settings(redis_url, prefix)
    server, switch = replica(governance, views=False)
    common = ["--governance", redis_url, "--prefix", prefix]
    async with client(server, switch, "sam", "auto") as (connected, _):
        await until(lambda: _ready(server), "the first sync")
        code = await anyio.to_thread.run_sync(main, [
            "flows", "deprecate", "order_status", "--version", "2.1", "--by", "alice",
            "--reason", "INC-7", "--wait", "10", *common])
        assert code == 0
        out = capsys.readouterr().out
        assert "order_status (version 2.1): deprecated; shared version 1" in out
        assert "applied by 1 live process(es)" in out
        listed = {t.name: t for t in await connected.list_tools()}
        assert listed["order_status"].description.startswith("Deprecated: ")
        assert await anyio.to_thread.run_sync(main, ["flows", "status", "--json", *common]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["version"] == 1
        assert status["decisions"] == {"order_status": {"all": None,
                                                        "versions": {"2.1": "deprecated"}}}
        (process,) = status["processes"].values()
        assert process["version"] == 1 and process["live"] and process["role"] == "serve"
        (audited,) = status["changes"]
        assert (audited["by"], audited["name"], audited["action"], audited["reason"]) == (
            "alice", "order_status", "deprecated", "INC-7")
        assert await anyio.to_thread.run_sync(main, ["flows", "status", *common]) == 0
        table = capsys.readouterr().out
        assert "order_status  2.1       deprecated" in table and "alice" in table
    unreachable = ["flows", "status", "--governance", "redis://127.0.0.1:1/0"]
    assert await anyio.to_thread.run_sync(main, unreachable) == 2
    assert "cannot reach" in capsys.readouterr().err


async def test_the_flows_command_refuses_a_name_no_process_entry_or_file_knows(
        redis_url: str, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    prefix = f"test:{uuid.uuid4().hex}"
    common = ["--governance", redis_url, "--prefix", prefix]
    store = GovernanceStore(redis_url, prefix)
    # No process, no entry, no file: nothing is known, nothing is written.
    assert await anyio.to_thread.run_sync(main, ["flows", "archive", "order_status",
                                                 *common]) == 1
    assert "no flow named 'order_status' is known" in capsys.readouterr().err
    assert await store.current_version() == 0
    server, switch = replica(settings(redis_url, prefix), views=False)
    async with client(server, switch, "sam", "auto"):
        await until(lambda: _ready(server), "the first sync")
        await until(lambda: _reports(store, "order_status"), "a heartbeat with the flows")
        code = await anyio.to_thread.run_sync(main, ["flows", "archive", "order_statu",
                                                     *common])
        out, err = capsys.readouterr()
        assert (code, out) == (1, "")
        assert err.startswith("chainweaver: error: no flow named 'order_statu' is known "
                              "(did you mean 'order_status'?): no live process reports it "
                              "(1 live)")
        assert err.count("\n") == 1
        assert await store.current_version() == 0  # refused before anything was written
        # A name the live replica reports is known.
        assert await anyio.to_thread.run_sync(main, ["flows", "archive", "order_status",
                                                     *common]) == 0
        assert "order_status (all versions): archived" in capsys.readouterr().out
        # A name only a flow file defines (no process runs it yet), and --force.
        flow_file = tmp_path / "brand_new.flow.json"
        flow_file.write_text(json.dumps({"name": "brand_new", "description": "B.",
                                         "steps": ["lookup"]}))
        assert await anyio.to_thread.run_sync(main, ["flows", "archive", "brand_new",
                                                     str(tmp_path), *common]) == 0
        assert await anyio.to_thread.run_sync(main, ["flows", "deprecate", "not_yet",
                                                     "--force", *common]) == 0
        # A name the shared entries hold stays known (here: withdrawn, gone from the
        # replica's registry but kept by its overlay, and held by an entry).
        assert await anyio.to_thread.run_sync(main, ["flows", "withdraw", "order_status",
                                                     *common]) == 0
        assert await anyio.to_thread.run_sync(main, ["flows", "activate", "not_yet",
                                                     *common]) == 0
        capsys.readouterr()
    await store.aclose()


async def _reports(store: GovernanceStore, flow: str) -> bool:
    beats = await store.heartbeats()
    return any(flow in (beat.get("flows") or []) for beat in beats.values())


async def test_two_followers_in_one_process_report_apart_and_wait_names_the_lagging_one(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Two servers in one process (or two containers whose processes share a host
    name and a pid, as with host networking) once heartbeat under one name, host:pid,
    each overwriting the other's: ``flows status`` showed one process, and
    ``flows ... --wait`` confirmed a change as soon as it read the heartbeat of the
    one that applied it, while the other still served the flow."""
    prefix = f"test:{uuid.uuid4().hex}"
    governance = settings(redis_url, prefix)
    store = GovernanceStore(redis_url, prefix)
    (applying, switch_a), (lagging, switch_b) = replica(governance, False), \
        replica(governance, False)

    def refuse(change: object) -> None:  # this server cannot publish the decision
        if getattr(change, "name", None) == "order_status":
            raise ExposureConfigError("refused here")

    lagging.executor.registry.subscribe(refuse)
    common = ["--governance", redis_url, "--prefix", prefix]
    async with client(applying, switch_a, "sam", "auto"), \
            client(lagging, switch_b, "sam", "auto"):
        await until(lambda: _ready(applying), "the first sync")
        await until(lambda: _ready(lagging), "the first sync")
        await until(lambda: _processes(store, 2), "a heartbeat from each server")
        code = await anyio.to_thread.run_sync(main, [
            "flows", "archive", "order_status", "--wait", "3", *common])
        out, err = capsys.readouterr()
        assert code == 1, out
        assert "not applied by 1 of 2 live process(es)" in err
        assert "could not apply order_status" in err
    await store.aclose()


async def _processes(store: GovernanceStore, count: int) -> bool:
    return len(await store.heartbeats()) == count
