"""A background task's arguments nested too deeply are the caller's mistake (-32602),
never an internal error, and the server keeps serving.

The 2026-07-28 streamable-HTTP transport decodes JSON nested up to ~1,000 levels, and
storing a task's payload walks it recursively: found by fuzzing every request's params.
The request goes through the client's dispatcher, because the client's own request
models refuse to serialise a value this deep before it is sent.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue

from chainweaver.mcp import FlowServer

pytestmark = [pytest.mark.anyio, pytest.mark.tasks]


def nested(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


async def raw_call(client: Client, arguments: dict[str, Any]) -> dict[str, Any]:
    """A modern ``tools/call`` sent as raw params (the session stamps its ``_meta``)."""
    data: dict[str, Any] = {"method": "tools/call",
                            "params": {"name": "price_quote", "arguments": arguments}}
    options: dict[str, Any] = {"timeout": 10}
    client.session._stamp(data, options)  # the 2026-07-28 envelope
    return await client.session._dispatcher.send_raw_request(  # type: ignore[no-any-return]
        "tools/call", data["params"], options)


@pytest.mark.parametrize("levels", [64, 500, 800])
async def test_deeply_nested_task_arguments_are_invalid_params(
    levels: int, all_logs: pytest.LogCaptureFixture,
) -> None:
    server = FlowServer(build_catalogue(), tasks="memory://")
    async with Client(server.fastmcp) as client:
        with pytest.raises(MCPError) as refused:
            await raw_call(client, {"sku": "SKU-1", "tags": nested(levels)})
        assert refused.value.error.model_dump() == {
            "code": -32602, "data": None,
            "message": "Invalid arguments for 'price_quote': nested more than 64 levels deep"}
        # The deepest accepted arguments still make a task; the server keeps serving.
        created = await raw_call(client, {"sku": "SKU-1", "tags": nested(63)})
        assert created["status"] == "working"
        assert "price_quote" in {tool.name for tool in await client.list_tools()}
    assert not [r for r in all_logs.records if r.levelno >= logging.ERROR]
