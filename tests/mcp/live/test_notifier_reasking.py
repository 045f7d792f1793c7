"""Listeners' callers asked again when there is news, in memory: the authenticator is
asked in no request's context (a change a tool makes inside another caller's request
tells a listener nothing of that caller's view), one notice is told at a time (a
change while listeners are being asked about waits for it), and a run is not held up
while its caller's listeners are asked about."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import anyio
import pytest
from fastmcp import Client
from fastmcp.server.dependencies import get_context
from mcp.client.subscriptions import listen
from support.catalogue import build_catalogue
from support.notices import Heard, listening
from support.views import schema_uri

from chainweaver import FlowExecutor
from chainweaver.mcp import (
    CallerIdentity,
    FlowServer,
    GateContext,
    RunHistory,
    SecurityConfig,
    visible_claim,
)
from chainweaver.mcp.live.notifications import MAX_ASKING

pytestmark = pytest.mark.anyio

BOUND = 30.0  # only stops a broken test from hanging
TEAMS = {"sam": ["search-team", "common"], "olga": ["orders-team", "pricing-team", "common"]}


def new_version(executor: FlowExecutor, name: str, version: str) -> None:
    current = executor.registry.get_flow(name)
    executor.registry.register_flow(dataclasses.replace(
        current, version=version, description=f"{current.description} ({version})"))


class BySession:
    """An authenticator that names the caller from the session of the request it runs
    in (FastMCP's request context), not from the ``GateContext`` it is given: asked
    outside any request, it cannot answer (it raises)."""

    def __init__(self) -> None:
        self.who = "sam"
        self.named: dict[str | None, str] = {}
        self.outside = 0  # times it was asked outside any request

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        try:
            session_id = get_context().session_id
        except RuntimeError:
            self.outside += 1
            raise
        who = self.named.setdefault(session_id, self.who)
        return CallerIdentity(who, {"teams": TEAMS[who]}, subject=who)


async def test_a_change_made_inside_a_request_is_not_asked_about_as_its_caller() -> None:
    """A tool olga calls publishes a new version of a flow only she sees. The notice
    used to run in her request's context, so sam's listen stream, asked about again,
    was answered as olga: sam heard that olga's list changed and that a schema he
    cannot see was updated. Asked in no request's context, the authenticator cannot
    name sam's caller: he hears nothing (fails closed)."""
    executor = build_catalogue()
    callers = BySession()
    server = FlowServer(executor, expose_schemas=True, security=SecurityConfig(
        authenticator=callers, visible=visible_claim("teams")))

    @server.fastmcp.tool
    async def publish_price_quote() -> str:
        new_version(executor, "price_quote", "9.0.0")  # in olga's view only
        return "published"

    hidden = schema_uri("price_quote")
    async with Client(server.fastmcp) as sam, \
            listening(sam.session, Heard(), [hidden]) as sam_heard:
        callers.who = "olga"
        async with Client(server.fastmcp) as olga:
            assert (await olga.call_tool("publish_price_quote", {})).data == "published"
            for _ in range(250):  # bounded wait for the notice to ask about sam
                if callers.outside or sam_heard.told:
                    break
                await asyncio.sleep(0.02)
            assert await sam_heard.take(0) == []
            assert callers.outside == 1  # asked, and could not answer


class Blocking:
    """An authenticator whose answers for listeners asked about again (a request
    context it has seen) wait until the test lets them go; it counts how many such
    answers are waited for at once."""

    def __init__(self) -> None:
        self.seen: list[GateContext] = []
        self.waiting = 0
        self.most_waiting = 0
        self.go = asyncio.Event()

    async def __call__(self, ctx: GateContext) -> CallerIdentity:
        if any(seen is ctx for seen in self.seen):
            self.waiting += 1
            self.most_waiting = max(self.most_waiting, self.waiting)
            try:
                await self.go.wait()
            finally:
                self.waiting -= 1
        else:
            self.seen.append(ctx)
        return CallerIdentity("sam", {"teams": TEAMS["sam"]}, subject="sam")


async def test_a_change_while_listeners_are_asked_about_waits_for_that_notice() -> None:
    """Two changes, the second while the first notice still waits for the
    authenticator: a second notice used to start beside the first (asking every
    listener's caller again, and then telling both, in either order). Now it waits,
    and the listener is told of both changes, in order, once each."""
    executor = build_catalogue()
    callers = Blocking()
    server = FlowServer(executor, security=SecurityConfig(
        authenticator=callers, visible=visible_claim("teams"), hook_timeout=30.0))
    async with Client(server.fastmcp) as sam, \
            listen(sam.session, tools_list_changed=True) as stream:
        new_version(executor, "product_search", "9.0.0")
        for _ in range(250):  # bounded wait for the first notice to ask about sam
            if callers.waiting:
                break
            await asyncio.sleep(0.02)
        assert callers.waiting == 1
        new_version(executor, "product_search", "10.0.0")
        await asyncio.sleep(0.5)  # ten debounce periods
        assert callers.most_waiting == 1
        callers.go.set()
        told = [type(await asyncio.wait_for(stream.__anext__(), 5)).__name__
                for _ in range(2)]
        assert told == ["ToolsListChanged"] * 2
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(stream.__anext__(), 0.5)


async def test_a_run_is_not_held_up_while_its_callers_listeners_are_asked_about() -> None:
    """A run's record changes at its start and end, inside its call; its caller's
    listeners were told there, each asked about again first: an authenticator slow to
    answer (up to hook_timeout each) held the call up. They are told beside it now."""
    callers = Blocking()
    server = FlowServer(build_catalogue(), run_history=RunHistory(),
                        security=SecurityConfig(authenticator=callers, hook_timeout=60.0))
    async with Client(server.fastmcp) as sam, \
            listen(sam.session, resource_subscriptions=["chainweaver://runs"]) as stream:
        called = await asyncio.wait_for(
            sam.call_tool("product_search", {"query": "lamp"}), BOUND)
        assert not called.is_error
        assert callers.waiting >= 1  # the listener is being asked about meanwhile
        callers.go.set()
        event = await asyncio.wait_for(stream.__anext__(), BOUND)
        assert (type(event).__name__, str(event.uri)) == ("ResourceUpdated",
                                                          "chainweaver://runs")


async def test_listeners_are_asked_about_by_a_few_tasks_not_one_each() -> None:
    """Up to 20,000 listeners (sessions and streams) are asked about at every notice:
    one task each used to be made at once. A few askers take them in turn, so the
    tasks alive while the authenticator is asked stay bounded, whatever the count."""
    executor = build_catalogue()
    alive: list[int] = []

    def everyone(ctx: GateContext) -> CallerIdentity:
        alive.append(len(asyncio.all_tasks()))
        return CallerIdentity("sam", {"teams": TEAMS["sam"]}, subject="sam")

    server = FlowServer(executor, expose_schemas=True, security=SecurityConfig(
        authenticator=everyone, visible=visible_claim("teams"),
        max_listen_streams_per_caller=200))
    streams = 80
    async with Client(server.fastmcp) as client:
        told = [Heard() for _ in range(streams)]
        async with contextlib.AsyncExitStack() as stack:
            for heard in told:
                await stack.enter_async_context(listening(client.session, heard, []))
            baseline = len(asyncio.all_tasks())
            alive.clear()
            new_version(executor, "product_search", "9.0.0")  # in sam's view
            with anyio.fail_after(BOUND):
                while not all(heard.told for heard in told):
                    await asyncio.sleep(0.02)
    assert len(alive) >= streams  # every stream's caller was asked about again
    assert max(alive) - baseline <= 2 * MAX_ASKING + 4
