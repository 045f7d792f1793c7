"""Lists and errors a standard client can receive, over streamable HTTP on 127.0.0.1,
where FastMCP's own client refuses a server-sent event above 1 MiB (both eras).

- Without ``ServingConfig(page_size=...)`` a catalogue of about 1,300 ordinary flows
  (an entry is about 1 KB) listed its tools in one message above 1 MiB ("SSE stream
  failed"): a list that does not fit is now cut by its size, each page under the
  limit, and the pages together are the whole list, in order.
- Error texts echoed the name or URI the caller sent, whole, twice: a 700 KB URI was
  answered with an error of about 1.4 MB. Every echo is now bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from pydantic import BaseModel
from support.procs import serving_http

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read", idempotent=True))
def shout(data: Text) -> Text:
    return Text(text=data.text.upper())


def catalogue(flows: int) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(shout)
    for index in range(flows):
        executor.registry.register_flow(Flow(
            f"flow_{index:05d}", "Shouts the text it is given, in capitals. " * 3,
            [FlowStep("shout")]))
    return FlowServer(executor, expose_schemas=True)


@asynccontextmanager
async def http_client(server: FlowServer, mode: str) -> AsyncIterator[Client]:
    async with serving_http(server) as url:
        transport = StreamableHttpTransport(url)
        async with Client(transport, mode=mode, timeout=60) as client:
            yield client


MODES = ["legacy", "auto"]  # 2025-11-25, and 2026-07-28 where the server offers it


@pytest.mark.parametrize("mode", MODES)
async def test_a_large_catalogue_lists_in_pages_that_fit_without_a_page_size(mode: str) -> None:
    async with http_client(catalogue(1300), mode) as client:
        tools = await client.list_tools()  # follows the cursors
        assert [tool.name for tool in tools] == [f"flow_{index:05d}" for index in range(1300)]
        for method, field in (("list_tools_mcp", "tools"),
                              ("list_resources_mcp", "resources"),
                              ("list_prompts_mcp", "prompts")):
            names, cursor, pages = [], None, 0
            while True:
                page = await getattr(client, method)(cursor=cursor)
                items = getattr(page, field)
                assert len(page.model_dump_json(by_alias=True, exclude_none=True)) < 2**20
                names += [getattr(item, "uri", None) or item.name for item in items]
                pages += 1
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert len(names) == len(set(names)), field
            if field == "tools":
                assert pages > 1 and names == [tool.name for tool in tools]


async def test_the_answer_to_a_very_long_uri_reaches_its_client() -> None:
    # 2025-11-25 only: at 2026-07-28 the name travels in the Mcp-Name header too, which
    # HTTP servers bound to 16 KiB (tests/mcp/test_echo_bounds.py covers both eras).
    from mcp import MCPError

    async with http_client(catalogue(1), "legacy") as client:
        with pytest.raises(MCPError) as refused:
            await client.session.read_resource(
                "chainweaver://flows/" + "x" * 700_000 + "/schema")  # type: ignore[arg-type]
        assert "not found" in refused.value.error.message.lower()
        message = refused.value.error.message
        assert len(message) < 17_000 and message.endswith("(700,049 characters in all)")
        result = await client.session.call_tool("y" * 700_000, {})
        assert result.is_error and len(result.content[0].text) < 17_000
