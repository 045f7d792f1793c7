"""Malformed task, subscription and listen requests get a caller error (-32602 or
-32601), never -32603, on both eras; the server keeps serving."""
from __future__ import annotations

from typing import Any

import mcp_types
import pytest
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel, ConfigDict
from support.catalogue import build_catalogue

from chainweaver.mcp import FlowServer

pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


class Anything(BaseModel):
    model_config = ConfigDict(extra="allow")


def task(method: str, params: Any) -> Any:
    """A tasks/* case: needs the tasks extra."""
    return pytest.param(method, params, marks=pytest.mark.tasks)


CASES: list[Any] = [
    task("tasks/get", {}),
    task("tasks/get", {"taskId": 123}),
    task("tasks/get", {"taskId": "x" * 5000}),
    task("tasks/get", {"taskId": "../../etc"}),
    task("tasks/cancel", {}),
    task("tasks/cancel", {"taskId": None}),
    task("tasks/cancel", {"taskId": "nope"}),
    task("tasks/update", {"taskId": "nope", "inputResponses": "junk"}),
    task("tasks/update", {"taskId": "nope", "inputResponses": {}}),
    task("tasks/update", {}),
    ("resources/subscribe", {}),
    ("resources/subscribe", {"uri": 5}),
    ("resources/unsubscribe", {"uri": ["a"]}),
    ("subscriptions/listen", {"notifications": "junk"}),
    ("subscriptions/listen", None),
]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("method,params", CASES)
async def test_malformed_new_kind_requests_are_not_internal_errors(
        mode: str, method: str, params: Any) -> None:
    tasks = "memory://" if method.startswith("tasks/") else None
    server = FlowServer(build_catalogue(), tasks=tasks, expose_schemas=True)
    async with Client(server.fastmcp, mode=mode) as client:
        request = mcp_types.Request(method=method, params=params)
        try:
            await client.session.send_request(request, Anything,
                                              request_read_timeout_seconds=3)
        except MCPError as error:
            assert error.error.code in (-32602, -32601), error.error.model_dump()
        # Still serving: the same session answers an ordinary request.
        assert await client.list_tools()
