"""A list cut by its size (no page size) is cut by the flow provider when it alone
serves the list: only the components of the page that fits are built and measured,
not the catalogue's, and each tool's size is measured once. The pages are the ones the
whole-list cut gave (tests/mcp/live/test_list_pages_by_size.py checks them on the
wire); with another component on the server, the whole list is cut as before."""

from __future__ import annotations

import pytest
from fastmcp import Client

from chainweaver.mcp.gate.body_cap import MESSAGE_BUDGET
from chainweaver.mcp.live.cursors import sent_size

from .test_list_pages_by_size import catalogue

pytestmark = pytest.mark.anyio


async def test_the_first_page_builds_only_its_own_components() -> None:
    server = catalogue(400)
    provider = server._provider
    async with Client(server.fastmcp) as client:
        first = await client.list_tools_mcp()
        assert first.next_cursor and len(first.tools) < 400
        # The page's tools, and the one measured past it that did not fit.
        assert provider.components_built == len(first.tools) + 1
        second = await client.list_tools_mcp(cursor=first.next_cursor)
        assert second.tools[0].name == f"flow_{len(first.tools):04d}"
        assert provider.components_built <= len(first.tools) + len(second.tools) + 1


async def test_a_tool_is_measured_once_at_its_size_as_sent() -> None:
    server = catalogue(3)
    async with Client(server.fastmcp) as client:
        listed = await client.list_tools_mcp()
    tool = server._provider.flow_tool(server._provider.exposure.tool("flow_0000"))
    assert tool.sent_size() == sent_size(listed.tools[0])
    calls = []
    original = tool.to_mcp_tool
    object.__setattr__(tool, "to_mcp_tool", lambda **kw: calls.append(1) or original(**kw))
    tool.sent_size()
    assert calls == []  # kept from the first measure


async def test_a_renamed_copy_measures_its_own_size() -> None:
    server = catalogue(1)
    tool = server._provider.flow_tool(server._provider.exposure.tool("flow_0000"))
    size = tool.sent_size()
    renamed = tool.model_copy(update={"name": "a_much_longer_name_for_the_same_flow"})
    assert renamed.sent_size() == size + len("a_much_longer_name_for_the_same_flow") \
        - len("flow_0000")


async def test_with_another_tool_on_the_server_the_whole_list_is_cut() -> None:
    server = catalogue(400)

    @server.fastmcp.tool
    def zzz_extra() -> str:
        return "x"

    async with Client(server.fastmcp) as client:
        first = await client.list_tools_mcp()
        assert len(first.model_dump_json(by_alias=True, exclude_none=True)) <= MESSAGE_BUDGET
        assert first.next_cursor
    assert server._provider.components_built == 400  # every flow tool: FastMCP's cut
