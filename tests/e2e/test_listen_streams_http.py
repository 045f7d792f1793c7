"""2026-07-28 listen streams over streamable HTTP on loopback: a caller over its cap of
open streams is refused with -32001 and the server keeps serving, the streams of
a client process that dies are forgotten, giving their places back, and a stream
whose bearer token expired by the wall clock hears nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from contextlib import AsyncExitStack

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.auth.providers.jwt import JWTVerifier
from mcp import MCPError
from mcp.client.subscriptions import listen
from support.catalogue import build_catalogue
from support.procs import serving_http
from support.tokens import AUDIENCE, ISSUER, KeyPair

from chainweaver.mcp import GATE_REFUSED, FlowServer, SecurityConfig

pytestmark = pytest.mark.anyio

BOUND = 30.0  # only stops a broken test from hanging
# A client in its own process: two listen streams, then it waits to be killed.
CHILD = """
import asyncio, sys
from contextlib import AsyncExitStack
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp.client.subscriptions import listen

async def main():
    async with Client(StreamableHttpTransport(sys.argv[1])) as client, \\
            AsyncExitStack() as streams:
        for _ in range(2):
            await streams.enter_async_context(listen(client.session, tools_list_changed=True))
        print("listening", flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


async def settled(server: FlowServer, count: int) -> int:
    notifier = server._notifier  # what it keeps is not public API
    for _ in range(int(BOUND / 0.05)):
        if notifier.listeners == count:
            break
        await asyncio.sleep(0.05)
    return notifier.listeners


async def test_listen_streams_are_capped_and_a_dead_clients_streams_are_forgotten() -> None:
    # Every caller here is anonymous: one caller, two streams.
    server = FlowServer(build_catalogue(),
                        security=SecurityConfig(max_listen_streams_per_caller=2))
    async with serving_http(server) as url:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, url, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        try:
            assert await asyncio.wait_for(child.stdout.readline(), BOUND) == b"listening\n"
            assert server._notifier.listeners == 2
            async with Client(StreamableHttpTransport(url)) as client, \
                    AsyncExitStack() as streams:
                with pytest.raises(MCPError) as caught:
                    await streams.enter_async_context(
                        listen(client.session, tools_list_changed=True))
                assert (caught.value.error.code, caught.value.error.message) == (
                    GATE_REFUSED, "Request refused: too_many_listen_streams")
                assert await client.list_tools()  # still serving
                child.kill()  # its connection drops with it: both streams go
                await asyncio.wait_for(child.wait(), BOUND)
                assert await settled(server, 0) == 0
                for _ in range(2):
                    await streams.enter_async_context(
                        listen(client.session, tools_list_changed=True))
                assert server._notifier.listeners == 2
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
    assert server._notifier.listeners == 0


async def test_a_stream_hears_nothing_once_the_wall_clock_passed_its_tokens_expiry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream ended at its token's ``exp`` by a timer alone, on the event loop's
    clock, which stands still while the host is suspended and does not follow a
    stepped wall clock: a stream whose token the wall clock says expired was still
    told of changes. Every notice now checks the wall clock (here it jumps two hours,
    past one token's ``exp`` and not the other's)."""
    keys = KeyPair()
    executor = build_catalogue()
    server = FlowServer(executor, security=SecurityConfig(
        auth=JWTVerifier(public_key=keys.public_pem, issuer=ISSUER, audience=AUDIENCE)))

    def transport(url: str, hours: int) -> StreamableHttpTransport:
        token = keys.token(f"for-{hours}h", [], expires_in=hours * 3600)
        return StreamableHttpTransport(url, headers={"Authorization": f"Bearer {token}"})

    async with serving_http(server) as url, \
            Client(transport(url, 1)) as short, Client(transport(url, 3)) as long, \
            listen(short.session, tools_list_changed=True) as short_stream, \
            listen(long.session, tools_list_changed=True) as long_stream:
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 2 * 3600)
        current = executor.registry.get_flow("product_search")
        executor.registry.register_flow(dataclasses.replace(current, version="9.0.0"))
        event = await asyncio.wait_for(long_stream.__anext__(), BOUND)
        assert type(event).__name__ == "ToolsListChanged"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(short_stream.__anext__(), 1.0)
