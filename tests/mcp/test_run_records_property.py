"""The run-records property in memory, on both protocol eras and both stores: ten
callers with different views start runs (calls, and tasks on 2026-07-28) on eight
flows; every caller then reads, lists, subscribes and guesses ids, before and after
flows leave their views, and never sees or can tell apart a run that is not its own
(see tests/support/run_records.py; over streamable HTTP with JWTs:
tests/e2e/test_run_records_http.py). The callers' ids are the hostile alphabet a key
layout must keep apart (``:``, ``|``, ``/``, ``*``, unicode, empty, a percent-escape).

Two grant layouts (seeds) on the in-memory store, one on each era, and the Redis store
on both eras: with tests/e2e/test_run_records_http.py, every pair of transport, era
and store is covered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastmcp import Client
from support.run_records import (
    HOSTILE_CALLERS,
    check_isolation,
    check_subscriptions,
    grants,
    run_catalogue,
    start_runs,
)

from chainweaver.mcp import CallerIdentity, FlowServer, GateContext, SecurityConfig, ServingConfig
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.views import visible_claim


class Switch:
    """The caller of every request: whoever the test says is calling now."""

    def __init__(self, given: dict[str, list[str]]) -> None:
        self.given = given
        self.who = next(iter(given))

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who, {"teams": self.given[self.who]}, subject=self.who)

    def become(self, who: str) -> None:
        self.who = who


def server_for(switch: Switch, store: str = "memory://", **options: Any) -> FlowServer:
    return FlowServer(run_catalogue(), security=SecurityConfig(
        authenticator=switch, visible=visible_claim("teams")),
        serving=ServingConfig(run_history=RunHistory(store=store,
                                                     prefix=f"test:{id(switch)}")),
        **options)


def connector(server: FlowServer, switch: Switch, mode: str) -> Any:
    @asynccontextmanager
    async def connect(who: str, handler: Any = None) -> AsyncIterator[Client]:
        switch.become(who)
        async with Client(server.fastmcp, mode=mode, message_handler=handler) as client:
            yield client

    return connect


async def check_property(seed: int, mode: str, store: str = "memory://") -> None:
    given = grants(seed, HOSTILE_CALLERS)
    switch = Switch(given)
    server = server_for(switch, store)
    connect = connector(server, switch, mode)
    runs = await start_runs(connect, given)
    await check_isolation(connect, given, runs)
    await check_subscriptions(connect, switch.become, given, runs, mode)
    # Flows leave views: every caller loses its first team.
    for who, teams in given.items():
        given[who] = teams[1:]
    await check_isolation(connect, given, runs)


@pytest.mark.anyio
@pytest.mark.parametrize(("seed", "mode"), [(1, "auto"), (2, "legacy")])
async def test_no_caller_sees_or_tells_apart_another_callers_runs(seed: int,
                                                                  mode: str) -> None:
    await check_property(seed, mode)


@pytest.mark.anyio
@pytest.mark.slow
@pytest.mark.tasks
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_property_holds_on_the_redis_store(redis_url: str, mode: str) -> None:
    await check_property(3, mode, redis_url)


@pytest.mark.anyio
@pytest.mark.tasks
async def test_runs_started_as_tasks_are_governed_alike() -> None:
    given = grants(4)
    switch = Switch(given)
    server = server_for(switch, tasks="memory://")
    connect = connector(server, switch, "auto")
    runs = await start_runs(connect, given, tasks=True)
    await check_isolation(connect, given, runs)
    switch.become(runs[0].caller)
    async with Client(server.fastmcp) as client:
        record = (await client.read_resource(f"chainweaver://runs/{runs[0].run_id}"))[0]
        assert '"task_id": null' not in record.text and '"status": "completed"' in record.text
