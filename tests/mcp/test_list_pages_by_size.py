"""Without a page size, a list too large for one message is cut by its size: every
page fits, the pages are the whole list in order, and the cursors of those pages are
bound to the caller's list like any other (a forged one is refused, a stale one asks
to list again). A list that fits is one page, as before."""

from __future__ import annotations

import pytest
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer
from chainweaver.mcp.gate.body_cap import MESSAGE_BUDGET
from chainweaver.mcp.live.cursors import LIST_AGAIN

pytestmark = pytest.mark.anyio
MODES = ["legacy", "auto"]


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read", idempotent=True))
def shout(data: Text) -> Text:
    return Text(text=data.text.upper())


def catalogue(flows: int, description: str = "Shouts. " * 500) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(shout)
    for index in range(flows):
        executor.registry.register_flow(
            Flow(f"flow_{index:04d}", description, [FlowStep("shout")]))
    return FlowServer(executor, expose_prompts=True)


async def pages(client: Client, method: str) -> list[list[str]]:
    found, cursor = [], None
    while True:
        page = await getattr(client, f"{method}_mcp")(cursor=cursor)
        items = page.tools if method == "list_tools" else page.prompts
        assert len(page.model_dump_json(by_alias=True, exclude_none=True)) <= MESSAGE_BUDGET
        found.append([item.name for item in items])
        cursor = page.next_cursor
        if cursor is None:
            return found


@pytest.mark.parametrize("mode", MODES)
async def test_a_list_above_one_message_is_cut_into_pages_that_fit(mode: str) -> None:
    # About 4 KB an entry: 400 flows list 1.6 MB of tools, and of prompts.
    async with Client(catalogue(400).fastmcp, mode=mode) as client:
        for method in ("list_tools", "list_prompts"):
            cut = await pages(client, method)
            assert len(cut) >= 2 and all(cut)
            names = [name for page in cut for name in page]
            assert names == sorted(names) and len(names) == len(set(names))
        assert [page for page in await pages(client, "list_tools") for page in page] == \
            [f"flow_{index:04d}" for index in range(400)]


async def test_a_list_that_fits_is_one_page() -> None:
    async with Client(catalogue(20).fastmcp) as client:
        assert [len(page) for page in await pages(client, "list_tools")] == [20]


async def test_size_cut_cursors_are_bound_to_the_list() -> None:
    server = catalogue(400)
    async with Client(server.fastmcp) as client:
        first = await client.list_tools_mcp()
        assert first.next_cursor
        fingerprint, _, position = first.next_cursor.partition(".")
        for forged in (f"{fingerprint}.x1", f"{fingerprint}.-5", "0123.4", "nonsense"):
            with pytest.raises(MCPError) as refused:
                await client.list_tools_mcp(cursor=forged)
            assert refused.value.error.code == -32602
        with pytest.raises(MCPError) as past_the_end:
            await client.list_tools_mcp(cursor=f"{fingerprint}.100000")
        assert past_the_end.value.error.message == LIST_AGAIN
        server.executor.registry.unregister("flow_0000")
        with pytest.raises(MCPError) as stale:
            await client.list_tools_mcp(cursor=first.next_cursor)
        assert stale.value.error.message == LIST_AGAIN
