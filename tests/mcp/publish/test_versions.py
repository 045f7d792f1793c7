"""A client asking for a specific version gets the exposed version or nothing."""

from __future__ import annotations

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue

from chainweaver.mcp import FlowServer


@pytest.mark.anyio
async def test_versioned_requests_match_only_the_exposed_flow_version() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    uri = "chainweaver://flows/order_status/schema"
    async with Client(server.fastmcp) as client:
        old = await client.call_tool("order_status", {"order_id": "A-1"}, version="1.9.0",
                                     raise_on_error=False)
        assert old.is_error and old.content[0].text == "Unknown tool: 'order_status'"
        for spelling in ("2.1.0", "2.1"):
            current = await client.call_tool("order_status", {"order_id": "A-1"},
                                             version=spelling)
            assert current.structured_content["status"] == "shipped"

        assert (await client.read_resource(uri, version="2.1.0"))[0].text
        with pytest.raises(MCPError) as missing:
            await client.read_resource(uri, version="1.9.0")
        assert missing.value.error.code == -32602

        rendered = await client.get_prompt("order_status", {"order_id": "A-1"},
                                           version="2.1.0")
        assert rendered.messages
        with pytest.raises(MCPError, match="Unknown prompt"):
            await client.get_prompt("order_status", {"order_id": "A-1"}, version="1.9.0")
