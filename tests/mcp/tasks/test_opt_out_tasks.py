"""A flow's ``governance.publish=False`` on task creation: a 2026-07-28 client creating
a task for it gets exactly the answer a task for a tool that never existed gets, and
``tasks/get`` of a made-up id answers as on a server without the opt-out."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue
from support.catalogue import opted_out_catalogue as opted_out

from chainweaver.mcp import FlowServer

pytestmark = pytest.mark.tasks
NEVER = "never_existed_flow"




async def _creation_error(client: Client, name: str) -> tuple[Any, ...]:
    from fastmcp_tasks import call_tool_task  # the tasks extra

    try:
        await call_tool_task(client, name, {"query": "lamp"})
    except MCPError as error:
        payload = error.error.model_dump(mode="json")
        return type(error), str(payload).replace(name, "NAME")
    except Exception as error:  # noqa: BLE001 - the type and text are what is compared
        return type(error), str(error).replace(name, "NAME")
    raise AssertionError(f"a task for {name} was created")


async def _made_up_status(client: Client) -> tuple[Any, ...]:
    from fastmcp_tasks import ToolTask, call_tool_task  # the tasks extra

    task = await call_tool_task(client, "order_status", {"order_id": "A-1"})
    made_up = ToolTask(client, "order_status",
                       task.create_result.model_copy(update={"task_id": "0" * 32}))
    with pytest.raises(MCPError) as missing:
        await made_up.status()
    return missing.value.error.code, missing.value.error.message


@pytest.mark.anyio
async def test_a_task_for_an_opted_out_flow_is_refused_like_a_tool_that_never_existed(
) -> None:
    hidden = FlowServer(opted_out(), tasks="memory://")
    plain = FlowServer(build_catalogue(), tasks="memory://")
    assert "product_search" not in hidden.registered_tool_names
    async with Client(hidden.fastmcp) as client, Client(plain.fastmcp) as other:
        opted = await _creation_error(client, "product_search")
        never = await _creation_error(client, NEVER)
        assert opted == never
        # tasks/get of a made-up id: the same answer as where nothing opted out.
        assert await _made_up_status(client) == await _made_up_status(other) == (
            -32602, f"Task {'0' * 32} not found")
