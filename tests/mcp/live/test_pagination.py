"""Listings are complete, ordered and identical whether paginated or not."""

from __future__ import annotations

import pytest
from fastmcp import Client
from support.catalogue import build_catalogue

from chainweaver.mcp import FlowServer, ServingConfig


async def _all_pages(client: Client, method: str, result_key: str) -> tuple[list[str], int]:
    names: list[str] = []
    cursor, pages = None, 0
    while True:
        result = await getattr(client, f"{method}_mcp")(cursor=cursor)
        items = getattr(result, result_key)
        names += [getattr(item, "name", None) or str(item.uri) for item in items]
        pages += 1
        cursor = result.next_cursor
        if not cursor:
            return names, pages


@pytest.mark.anyio
async def test_paged_listings_equal_unpaged_listings() -> None:
    unpaged = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    paged = FlowServer(
        build_catalogue(),
        expose_schemas=True,
        expose_prompts=True,
        serving=ServingConfig(page_size=2),
    )
    async with Client(unpaged.fastmcp) as a, Client(paged.fastmcp) as b:
        for method, key in [("list_tools", "tools"), ("list_resources", "resources"),
                            ("list_prompts", "prompts")]:
            whole, whole_pages = await _all_pages(a, method, key)
            parts, part_pages = await _all_pages(b, method, key)
            assert parts == whole
            assert whole_pages == 1
            assert part_pages == -(-len(whole) // 2)
            assert len(set(parts)) == len(parts)
    assert unpaged.registered_tool_names == sorted(unpaged.registered_tool_names)
