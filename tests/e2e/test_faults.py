"""Faults under load over streamable HTTP: flows that raise, hang past ``flow_timeout`` or
return malformed output, called concurrently with normal requests on all three primitives.

Normal requests all succeed with their own answers, the failing calls come back as
``isError`` results naming only the error type (``error_detail="type_only"``), and the
server keeps serving. The server is ``tests/servers/hardened_server.py --faulty``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from support.procs import free_port, stop, wait_until_listening

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "hardened_server.py"
sys.path.insert(0, str(SERVER_SCRIPT.parent))
from hardened_server import SECRET  # noqa: E402

CONCURRENT = 50
# What each failing flow's isError result says with error_detail="type_only".
FAILURES = {"faulty_raises": "RuntimeError", "faulty_hangs": "TimeoutError",
            "faulty_malformed": "StepOutputError"}


@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("faults") / "server.log"
    port = free_port()
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), "--port", str(port), "--faulty",
             "--flow-timeout", "2", "--error-detail", "type_only"],
            stdout=output, stderr=subprocess.STDOUT,
        )
        try:
            wait_until_listening(process, port)
            yield f"http://127.0.0.1:{port}/mcp", log
        finally:
            stop(process)
    text = log.read_text()
    assert "Traceback" not in text and not re.search(r"\bERROR\b", text), text


Check = Callable[[Any], None]


def request(i: int) -> tuple[str, Callable[[Client], Awaitable[Any]], Check]:
    """The i-th request of a load run: (label, how to send it, how to check its answer).

    Every answer depends on ``i``, so a mixed-up response would be caught.
    """
    slot = i % 10
    if slot < len(FAILURES):
        flow, error_type = list(FAILURES.items())[slot]

        def failed(result: Any) -> None:
            assert result.is_error and result.content[0].text == error_type

        return flow, lambda c: c.call_tool(flow, {"query": f"q{i}"}, raise_on_error=False), \
            failed
    if slot in (3, 4):
        def quoted(result: Any) -> None:
            assert result.structured_content == {"sku": f"SKU-{i}", "total_cents": 999 * i}

        return "tool", lambda c: c.call_tool("price_quote", {"sku": f"SKU-{i}",
                                                             "quantity": i}), quoted
    if slot in (5, 6):
        def read(contents: Any) -> None:
            assert json.loads(contents[0].text)["tool_name"] == "order_status"

        return "resource", lambda c: c.read_resource(
            "chainweaver://flows/order_status/schema"), read
    if slot == 7:
        def summary(result: Any) -> None:
            assert result.structured_content["summary"] == f"Order A-{i} is shipped with DHL."

        return "tool", lambda c: c.call_tool("order_status", {"order_id": f"A-{i}"}), summary

    def rendered(result: Any) -> None:
        text = result.messages[0].content.text
        assert f'<user-data name="first">item {i}</user-data>' in text

    return "prompt", lambda c: c.get_prompt("product_search__compare",
                                            {"first": f"item {i}", "second": "x"}), rendered


async def run_load(url: str, clients: int, per_client: int) -> dict[str, int]:
    """``clients`` connections sending ``per_client`` requests each, all at once."""
    seen: dict[str, int] = {}
    answers: list[tuple[int, Any]] = []

    async def one(client: Client, i: int) -> None:
        label, send, _ = request(i)
        answers.append((i, await send(client)))
        seen[label] = seen.get(label, 0) + 1

    async def connection(n: int) -> None:
        mode = "legacy" if n % 2 else "auto"  # both protocol eras share the load
        async with Client(StreamableHttpTransport(url), mode=mode) as client, \
                anyio.create_task_group() as group:
            for k in range(per_client):
                group.start_soon(one, client, n * per_client + k)

    async with anyio.create_task_group() as group:
        for n in range(clients):
            group.start_soon(connection, n)
    assert len(answers) == clients * per_client
    for i, answer in answers:
        request(i)[2](answer)
        assert SECRET not in str(answer)
    return seen


@pytest.mark.anyio
async def test_failing_flows_under_concurrent_load_leave_normal_requests_untouched(
    faulty_server: tuple[str, Path],
) -> None:
    url, _ = faulty_server
    seen = await run_load(url, clients=5, per_client=CONCURRENT // 5)
    assert seen == {"faulty_raises": 5, "faulty_hangs": 5, "faulty_malformed": 5,
                    "tool": 15, "resource": 10, "prompt": 10}


@pytest.mark.anyio
async def test_the_server_keeps_serving_after_repeated_waves_of_faults(
    faulty_server: tuple[str, Path],
) -> None:
    url, _ = faulty_server
    for _ in range(3):
        await run_load(url, clients=2, per_client=20)
    async with Client(StreamableHttpTransport(url)) as client:
        quote = await client.call_tool("price_quote", {"sku": "SKU-1", "quantity": 2})
        assert quote.structured_content == {"sku": "SKU-1", "total_cents": 1998}
        hung = await client.call_tool("faulty_hangs", {"query": "q"}, raise_on_error=False)
        assert hung.is_error and hung.content[0].text == "TimeoutError"
