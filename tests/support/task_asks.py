"""Helpers for tests of a background task that asks (approval): a client that may be
asked and answers by hand, waiting for the ask, and ``tasks/update`` as sent on the wire."""

from __future__ import annotations

from typing import Any

import mcp_types
from fastmcp import Client
from fastmcp_tasks import ToolTask

LIMIT = 10.0  # seconds: only to stop a hang


async def by_hand(*_: Any) -> Any:
    """An elicitation handler for tests that answer every ask through ``tasks/update``."""
    raise AssertionError("this test answers a task's ask by hand (tasks/update)")


def answering(target: Any) -> Client:
    """A client of ``target`` (a FlowServer, a FastMCP server or a transport) that
    declares elicitation, so its tasks may ask, and answers by hand."""
    from chainweaver.mcp import FlowServer

    server = target.fastmcp if isinstance(target, FlowServer) else target
    return Client(server, elicitation_handler=by_hand)


async def waiting(task: ToolTask, timeout: float = LIMIT) -> dict[str, Any]:
    """Wait until the task asks; its input requests, as sent on the wire."""
    status = await task.wait(state="input_required", timeout=timeout)
    assert status.input_requests
    return status.input_requests


def reply(requests: dict[str, Any], action: str, content: Any = None) -> dict[str, Any]:
    """The same answer to every request the task surfaced."""
    answer: dict[str, Any] = {"action": action}
    if content is not None:
        answer["content"] = content
    return {key: answer for key in requests}


async def send_task_update(client: Client, task_id: str, responses: Any = None) -> Any:
    """``tasks/update`` as a client sends it (``ToolTask`` has no method for it: its
    ``result()`` answers input requests through the elicitation handler)."""
    from fastmcp_tasks.client_models import UpdateTaskRequest, UpdateTaskRequestParams

    request = UpdateTaskRequest(params=UpdateTaskRequestParams(
        task_id=task_id, input_responses={} if responses is None else responses))
    return await client.session.send_request(request, mcp_types.Result)


async def update_task(task: ToolTask, responses: Any) -> Any:
    """Answer ``task`` (its own client sends ``tasks/update``)."""
    return await send_task_update(task._client, task.task_id, responses)
