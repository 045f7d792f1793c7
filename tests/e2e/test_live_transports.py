"""``chainweaver serve --watch`` over real transports: an edited flow file goes live,
clients are told (stdio and stateful HTTP, both eras), a bad edit changes nothing and
is logged with its file and line, and stateless HTTP clients are told nothing."""

from __future__ import annotations

import asyncio
import inspect
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from mcp.client.subscriptions import listen
from support.procs import free_port, stop, wait_until_listening

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHAINWEAVER = shutil.which("chainweaver", path=str(BIN)) or str(BIN / "chainweaver")
TOOLS = str(ROOT / "examples" / "flow_tools.py")
BOUND = 20.0  # only stops a broken test from hanging


@asynccontextmanager
async def watched_server(tmp_path: Path, transport: str, mode: str
                         ) -> AsyncIterator[tuple[Client, Path, Path]]:
    flows = tmp_path / "flows"
    shutil.copytree(ROOT / "examples" / "flows", flows)
    log = tmp_path / "server.log"
    args = ["serve", str(flows), "--tools", TOOLS, "--expose-schemas", "--watch",
            "--watch-interval", "0.1"]
    if transport == "stdio":
        async with Client(StdioTransport(CHAINWEAVER, args, cwd=str(ROOT), keep_alive=False,
                                         log_file=log), mode=mode,
                          message_handler=HEARD) as client:
            yield client, flows, log
        return
    port = free_port()
    extra = ["--transport", "streamable-http", "--port", str(port)]
    if transport == "stateless-http":
        extra.append("--stateless")
    with open(log, "w") as output:
        process = subprocess.Popen([CHAINWEAVER, *args, *extra], cwd=ROOT, stdout=output,
                                   stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            async with Client(StreamableHttpTransport(f"http://127.0.0.1:{port}/mcp"),
                              mode=mode, message_handler=HEARD) as client:
                yield client, flows, log
        finally:
            stop(process)


class Heard:
    """2025-11-25 notifications, by method."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def __call__(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if method is not None and method.startswith("notifications/"):
            self.methods.append(method)


HEARD = Heard()


async def until(check: Callable[[], Any]) -> Any:
    """Poll ``check`` (sync or async) until it holds; bounded."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.05)
    raise AssertionError("the server did not follow the edit")


def archive(flows: Path, name: str) -> None:
    path = flows / f"{name}.flow.yaml"
    path.write_text(path.read_text().replace("lifecycle: active", "lifecycle: archived"))


async def tool_names(client: Client) -> set[str]:
    return {t.name for t in await client.list_tools()}


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_edited_flow_file_goes_live_and_clients_are_told(
        tmp_path: Path, transport: str, mode: str) -> None:
    HEARD.methods.clear()
    async with watched_server(tmp_path, transport, mode) as (client, flows, log):
        assert "order_total" in await tool_names(client)
        if mode == "legacy":
            archive(flows, "order_total")
            await until(lambda: TOOLS_CHANGED in HEARD.methods)
        else:
            async with listen(client.session, tools_list_changed=True) as events:
                archive(flows, "order_total")
                event = await asyncio.wait_for(events.__anext__(), BOUND)
            assert type(event).__name__ == "ToolsListChanged"
        assert "order_total" not in await tool_names(client)
        gone = await client.call_tool("order_total", {"order_id": "A-1003"},
                                      raise_on_error=False)
        assert gone.is_error and gone.content[0].text == "Unknown tool: 'order_total'"
        # A bad edit: the last good flows keep serving, the log names file and line.
        broken = flows / "help_search.flow.json"
        broken.write_text('{"name": "help_search",\n  "version": }\n')
        await until(lambda: "help_search.flow.json" in log.read_text())
        assert "help_search" in await tool_names(client)
        served = await client.call_tool("help_search", {"query": "parcel"})
        assert served.structured_content["article_ids"] == ["kb-12"]
    text = log.read_text()
    assert "last good flows keep serving" in text and "line 2" in text


async def test_stateless_http_clients_follow_on_their_next_request(tmp_path: Path) -> None:
    HEARD.methods.clear()
    async with watched_server(tmp_path, "stateless-http", "legacy") as (client, flows, _):
        capabilities = client.server_capabilities
        assert not capabilities.tools.list_changed
        assert not (capabilities.prompts and capabilities.prompts.list_changed)
        assert not capabilities.resources.list_changed and not capabilities.resources.subscribe
        assert "order_total" in await tool_names(client)
        archive(flows, "order_total")
        await until(lambda: _absent(client, "order_total"))
        await asyncio.sleep(0.5)  # what would have been sent has been sent
    assert HEARD.methods == []  # no channel back: nothing is sent


TOOLS_CHANGED = "notifications/tools/list_changed"


async def _absent(client: Client, name: str) -> bool:
    return name not in await tool_names(client)
