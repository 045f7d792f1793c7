"""2026-07-28 listen streams over streamable HTTP on loopback: a caller over its cap of
open streams is refused with -32001 and the server keeps serving, and the streams of
a client process that dies are forgotten, giving their places back."""

from __future__ import annotations

import asyncio
import sys
from contextlib import AsyncExitStack

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp import MCPError
from mcp.client.subscriptions import listen
from support.catalogue import build_catalogue
from support.procs import serving_http

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
