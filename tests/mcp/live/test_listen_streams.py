"""2026-07-28 listen streams, in memory: each is forgotten when it ends (however it
ends), one caller cannot hold an unbounded number of them, and a change is compared
once per view, not once per stream (over HTTP: tests/e2e/test_listen_streams_http.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import AsyncExitStack
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from mcp.client.subscriptions import listen
from support.catalogue import build_catalogue

from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    visible_claim,
)
from chainweaver.mcp.live import notifications

pytestmark = pytest.mark.anyio

TEAMS = {"sam": ["search-team", "common"], "olga": ["orders-team", "common"]}


class Callers:
    """An authenticator whose caller the test picks before each client connects (in
    memory there are no headers); a request context asked about again names the caller
    it named then."""

    def __init__(self) -> None:
        self.who = "sam"
        self.named: dict[int, tuple[GateContext, str]] = {}

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        who = self.named.setdefault(id(ctx), (ctx, self.who))[1]
        return CallerIdentity(who, {"teams": TEAMS[who]}, subject=who)


async def settled(server: FlowServer, count: int) -> int:
    """How many listeners the server keeps, once it is ``count`` (bounded wait)."""
    notifier = server._notifier  # what it keeps is not public API
    for _ in range(250):
        if notifier.listeners == count:
            break
        await asyncio.sleep(0.02)
    return notifier.listeners


async def refusal(stack: AsyncExitStack, client: Client) -> tuple[int, str, Any]:
    with pytest.raises(MCPError) as caught:
        await stack.enter_async_context(listen(client.session, tools_list_changed=True))
    error = caught.value.error
    return error.code, error.message, error.data


async def test_a_listen_stream_is_forgotten_however_it_ends() -> None:
    server = FlowServer(build_catalogue())
    async with Client(server.fastmcp) as client:
        async with listen(client.session, tools_list_changed=True):  # the client cancels
            assert await settled(server, 1) == 1
        assert await settled(server, 0) == 0
        async with listen(client.session, tools_list_changed=True) as stream:
            for open_stream in list(server._notifier._streams.values()):
                open_stream.handler.close()  # the server ends it (as at the token's expiry)
            assert [event async for event in stream] == []  # ended gracefully
        assert await settled(server, 0) == 0
        async with AsyncExitStack() as streams:
            for _ in range(3):
                await streams.enter_async_context(
                    listen(client.session, tools_list_changed=True))
            assert await settled(server, 3) == 3
            await client.__aexit__(None, None, None)  # the connection closes under them
            assert await settled(server, 0) == 0


async def test_one_caller_cannot_hold_unbounded_listen_streams() -> None:
    callers = Callers()
    events: list[AuditEvent] = []
    server = FlowServer(build_catalogue(), security=SecurityConfig(
        authenticator=callers, audit_hook=events.append,
        max_listen_streams_per_caller=2, max_listen_streams=3))
    notifier = server._notifier
    async with AsyncExitStack() as stack:
        sam = await stack.enter_async_context(Client(server.fastmcp))
        sams = AsyncExitStack()
        for _ in range(2):
            await sams.enter_async_context(listen(sam.session, tools_list_changed=True))
        assert await refusal(stack, sam) == (GATE_REFUSED, "Request refused: "
                                             "too_many_listen_streams",
                                             {"reason": "too_many_listen_streams"})
        assert notifier.listeners == 2  # the refused one left nothing behind
        denied = [e for e in events if e.decision == "denied"]
        assert [(e.kind, e.name, e.caller_id, e.reason) for e in denied] == [
            ("subscription", "subscriptions/listen", "sam", "too_many_listen_streams")]
        # Another caller still listens, up to the server's cap.
        callers.who = "olga"
        olga = await stack.enter_async_context(Client(server.fastmcp))
        await stack.enter_async_context(listen(olga.session, tools_list_changed=True))
        assert await refusal(stack, olga) == (GATE_REFUSED, "Request refused: "
                                              "listen_streams_full",
                                              {"reason": "listen_streams_full"})
        # A stream that ends gives its place back.
        await sams.aclose()
        assert await settled(server, 1) == 1
        callers.who = "sam"
        again = await stack.enter_async_context(Client(server.fastmcp))
        async with listen(again.session, tools_list_changed=True) as stream:
            current = server.executor.registry.get_flow("product_search")
            server.executor.registry.register_flow(
                dataclasses.replace(current, version="9.0.0"))
            event = await asyncio.wait_for(stream.__anext__(), 5)
            assert type(event).__name__ == "ToolsListChanged"


async def test_an_open_server_caps_anonymous_listen_streams_too() -> None:
    # No hook: the gate stays out of the way, and the cap still holds.
    server = FlowServer(build_catalogue(),
                        security=SecurityConfig(max_listen_streams_per_caller=2))
    async with AsyncExitStack() as stack:
        for _ in range(2):
            client = await stack.enter_async_context(Client(server.fastmcp))
            await stack.enter_async_context(listen(client.session, tools_list_changed=True))
        client = await stack.enter_async_context(Client(server.fastmcp))
        code, message, _ = await refusal(stack, client)
        assert (code, message) == (GATE_REFUSED, "Request refused: too_many_listen_streams")
        assert await client.list_tools()  # the refusal leaves the server serving


async def test_a_change_is_compared_once_per_view_not_per_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[object] = []

    def counted(*args: Any) -> notifications.ViewChange:
        compared.append(args)
        return original(*args)

    original = notifications.view_changes
    monkeypatch.setattr(notifications, "view_changes", counted)
    callers = Callers()
    server = FlowServer(build_catalogue(), security=SecurityConfig(
        authenticator=callers, visible=visible_claim("teams")))
    streams = []
    async with AsyncExitStack() as stack:
        for who in ("sam", "olga"):
            callers.who = who
            client = await stack.enter_async_context(Client(server.fastmcp))
            for _ in range(5):
                streams.append((who, await stack.enter_async_context(
                    listen(client.session, tools_list_changed=True))))
        current = server.executor.registry.get_flow("product_search")  # sam's view only
        server.executor.registry.register_flow(dataclasses.replace(current, version="9.0.0"))
        for who, stream in streams:
            if who == "sam":
                event = await asyncio.wait_for(stream.__anext__(), 5)
                assert type(event).__name__ == "ToolsListChanged"
    assert len(compared) == 2  # one per grant set, for ten streams
