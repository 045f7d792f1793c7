"""Change notifications follow each JWT caller's view over stateful streamable HTTP, on
both eras: ``tests/servers/views_server.py`` with ``--watch``; a flow file added for one
team tells only that team's client, one for a team both callers share tells both, and
the listen request is audited under the token's caller."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from support.notices import PROMPTS, RESOURCES, TOOLS, Heard, listening
from support.procs import stop
from support.tokens import KeyPair

from .test_views_http import start

pytestmark = pytest.mark.anyio

BOTH = sorted([TOOLS, RESOURCES, PROMPTS])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    keys = KeyPair()
    flows = tmp_path / "flows"
    flows.mkdir()
    audit = tmp_path / "audit.jsonl"
    process, url, log = start(tmp_path, "--public-key",
                              str(keys.write_public(tmp_path / "key.pem")),
                              "--audit-log", str(audit), "--watch", str(flows))
    try:
        yield {"url": url, "flows": flows, "audit": audit, "keys": keys}
    finally:
        stop(process)
    assert "Traceback" not in log.read_text()


@asynccontextmanager
async def follower(url: str, token: str, mode: str) -> AsyncIterator[Heard]:
    heard = Heard()
    transport = StreamableHttpTransport(url, headers={"Authorization": f"Bearer {token}"})
    if mode == "legacy":
        async with Client(transport, mode=mode, message_handler=heard) as client:
            await client.list_tools()  # the session is known, as the token's caller
            yield heard
        return
    async with Client(transport) as client, listening(client.session, heard, []):
        yield heard


def add_flow(directory: Path, name: str, owner: str) -> None:
    (directory / f"{name}.flow.json").write_text(json.dumps({
        "name": name, "description": f"Owned by {owner}.",
        "governance": {"owner": owner}, "steps": [{"tool": "search_products"}]}))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_each_token_caller_is_told_only_of_changes_in_its_view(
        server: dict[str, Any], mode: str) -> None:
    keys = server["keys"]
    sam = keys.token("sam", ["search-team", "common"])
    olga = keys.token("olga", ["orders-team", "common"])
    async with follower(server["url"], sam, mode) as sam_heard, \
            follower(server["url"], olga, mode) as olga_heard:
        add_flow(server["flows"], "search_extra", "search-team")
        assert await sam_heard.take(3) == BOTH
        assert await olga_heard.take(0) == []
        add_flow(server["flows"], "shared_extra", "common")
        assert await sam_heard.take(3) == BOTH
        assert await olga_heard.take(3) == BOTH
    if mode == "auto":
        events = [json.loads(line) for line in server["audit"].read_text().splitlines()]
        listens = {(e["caller_id"], e["decision"]) for e in events
                   if e["kind"] == "subscription" and e["name"] == "subscriptions/listen"}
        assert listens == {("client-sam|sam", "allowed"), ("client-olga|olga", "allowed")}
