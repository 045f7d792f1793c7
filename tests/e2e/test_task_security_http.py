"""Background tasks of JWT callers over streamable HTTP, against
``tests/servers/task_jwt_server.py``: another subject's task, and a task whose flow left
its caller's view, answer exactly like a task id that never existed; a ``tasks/*``
request whose ``Mcp-Name`` header disagrees with its ``taskId`` is refused the same way
whoever owns the id, so the header cannot probe another caller's tasks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp_tasks import ToolTask, call_tool_task
from mcp import MCPError
from support.procs import free_port, stop, wait_until_listening
from support.tokens import KeyPair

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "task_jwt_server.py"
NEVER = "A" * 43  # a well-formed task id that was never issued
LIMIT = 30.0  # seconds: only to stop a hang


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[KeyPair, str]]:
    keys = KeyPair()
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, str(SERVER_SCRIPT), str(port),
                                    str(keys.write_public(tmp_path / "key.pem"))],
                                   stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until_listening(process, port)
        yield keys, f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)
    assert "Traceback" not in log.read_text()


def tampering(name: str) -> Any:
    """An httpx client factory whose tasks/* requests carry ``Mcp-Name: name``."""

    async def rewrite(request: httpx2.Request) -> None:
        try:
            method = json.loads(request.content).get("method", "")
        except (ValueError, AttributeError):
            return
        if isinstance(method, str) and method.startswith("tasks/"):
            request.headers["Mcp-Name"] = name

    def factory(**options: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(event_hooks={"request": [rewrite]}, **options)

    return factory


def client(url: str, token: str, header: str | None = None) -> Client:
    """A JWT caller's client; ``header``: the ``Mcp-Name`` its tasks/* requests carry."""
    factory = tampering(header) if header is not None else None
    return Client(StreamableHttpTransport(url, auth=token, httpx_client_factory=factory))


def handle(c: Client, task: ToolTask, task_id: str) -> ToolTask:
    return ToolTask(c, "report", task.create_result.model_copy(update={"task_id": task_id}))


async def answers(c: Client, task: ToolTask) -> tuple[Any, dict[str, Any]]:
    """(what tasks/get answers this client for ``task``, the error for an id never issued,
    naming ``task``'s id)."""
    try:
        value: Any = (await handle(c, task, task.task_id).status()).status
    except MCPError as error:
        value = error.error.model_dump()
    with pytest.raises(MCPError) as never:
        await handle(c, task, NEVER).status()
    expected = never.value.error.model_dump()
    return value, {**expected, "message": expected["message"].replace(NEVER, task.task_id)}


@pytest.mark.anyio
async def test_another_subject_and_a_narrowed_view_get_not_found(
        served: tuple[KeyPair, str]) -> None:
    keys, url = served
    async with client(url, keys.token("alice", [], flows=["report"])) as c:
        task = await call_tool_task(c, "report", {"n": 1})
        result = await asyncio.wait_for(task.result(), LIMIT)
    assert result.structured_content == {"n": 21}
    async with client(url, keys.token("bob", [], flows=["report"])) as c:
        bob, never = await answers(c, task)
    assert bob == never and never["code"] == -32602
    # The same subject (the same task scope) with a token whose view lost the flow.
    async with client(url, keys.token("alice", [], flows=[])) as c:
        narrowed, never = await answers(c, task)
    assert narrowed == never
    async with client(url, keys.token("alice", [], flows=["report"])) as c:
        again, _ = await answers(c, task)
    assert again == "completed"


async def error_of(c: Client, task: ToolTask, task_id: str, method: str) -> dict[str, Any]:
    theirs = ToolTask(c, "report", task.create_result.model_copy(update={"task_id": task_id}))
    call = theirs.status() if method == "get" else theirs.cancel()
    with pytest.raises(MCPError) as refused:
        await call
    error = refused.value.error.model_dump()
    return {**error, "message": str(error["message"]).replace(task_id, "<id>")}


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["get", "cancel"])
async def test_a_mismatched_name_header_answers_alike_for_every_task_id(
        served: tuple[KeyPair, str], method: str) -> None:
    keys, url = served
    async with client(url, keys.token("alice", [], flows=["report"])) as c:
        task = await call_tool_task(c, "report", {"n": 1})
        await asyncio.wait_for(task.result(), LIMIT)
    errors = []
    for who in ("alice", "bob"):
        token = keys.token(who, [], flows=["report"])
        async with client(url, token, header="not-the-task-id") as c:
            errors.append(await error_of(c, task, task.task_id, method))
            errors.append(await error_of(c, task, NEVER, method))
    assert all(error == errors[0] for error in errors), errors
    assert errors[0]["code"] not in (-32603, -32602), errors[0]
    async with client(url, keys.token("alice", [], flows=["report"])) as c:
        still = await ToolTask(c, "report", task.create_result).status()
    assert still.status == "completed"
