"""docs/security.md stays true: its Python blocks, run as one script, build the hooks
and the server the page describes, and that server behaves as described when served
over streamable HTTP. (That each block also runs alone is test_code_blocks.py's job.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp import MCPError
from support.procs import STARTUP_TIMEOUT, free_port

from chainweaver.mcp import CallerIdentity, GateContext

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def run_python_blocks() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    for code in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL):
        exec(compile(code, str(DOC), "exec", dont_inherit=True), namespace)
    return namespace


def context(**headers: str) -> GateContext:
    return GateContext("tool", "order_status", "order_status", "1.0.0", headers)


def test_the_authenticator_and_limiter_examples_behave_as_described(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    doc = run_python_blocks()
    authenticate = doc["authenticate"]
    assert authenticate(context(authorization="Bearer tok-ops-4f1c")).id == "ops"
    assert authenticate(context(authorization="bearer tok-support-9b2e")).id == "support"
    for header in ("Bearer tok-ops-4f1", "Basic tok-ops-4f1c", "tok-ops-4f1c", ""):
        assert authenticate(context(authorization=header)) is None
    assert authenticate(context()) is None

    limiter = doc["limiter"]
    support, ops = CallerIdentity("support"), CallerIdentity("ops")
    assert sum(limiter.acquire(support, "order_status") for _ in range(130)) == 120
    assert sum(limiter.acquire(ops, "order_status") for _ in range(1300)) == 1200


@pytest.mark.anyio
async def test_the_documented_server_gates_all_three_primitives_over_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the audit example writes audit.jsonl here
    doc = run_python_blocks()
    server = doc["server"]
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"

    def client(token: str | None) -> Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return Client(StreamableHttpTransport(url, headers=headers))

    async with anyio.create_task_group() as group:
        group.start_soon(lambda: server.serve_async("streamable-http", "127.0.0.1", port,
                                                    stateless=True))
        with anyio.fail_after(STARTUP_TIMEOUT):  # only stops a broken test from hanging
            while True:
                try:
                    await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                    break
                except OSError:
                    await anyio.sleep(0.05)
        try:
            async with client("tok-ops-4f1c") as ops:
                result = await ops.call_tool("order_status", {"order_id": "A-7"})
                assert json.loads(result.content[0].text) == {"order_id": "A-7",
                                                              "status": "shipped"}
                failed = await ops.call_tool("order_status", {"order_id": "nope"},
                                             raise_on_error=False)
                assert failed.is_error and "order_id" in failed.content[0].text
            async with client("tok-support-9b2e") as support:
                schema = await support.read_resource("chainweaver://flows/order_status/schema")
                assert json.loads(schema[0].text)["tool_name"] == "order_status"
                prompt = await support.get_prompt("order_status", {"order_id": "A-7"})
                assert '"order_id": "A-7"' in prompt.messages[0].content.text
                with pytest.raises(MCPError) as refused:
                    await support.call_tool("order_status", {"order_id": "A-7"})
                assert refused.value.error.data == {"reason": "tools_not_permitted"}
            async with client(None) as anonymous:
                with pytest.raises(MCPError, match="Request refused: unauthenticated"):
                    await anonymous.get_prompt("order_status", {"order_id": "A-7"})
        finally:
            group.cancel_scope.cancel()

    assert doc["refusals"]() == {"tools_not_permitted": 1, "unauthenticated": 1}
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert {e["caller_id"] for e in events} == {"ops", "support", None}
    assert all("A-7" not in json.dumps(e) for e in events)
