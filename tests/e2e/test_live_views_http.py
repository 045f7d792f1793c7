"""Change notifications follow each JWT caller's view over stateful streamable HTTP, on
both eras: ``tests/servers/views_server.py`` with ``--watch``; a flow file added for one
team tells only that team's client, one for a team both callers share tells both, and
the listen request is audited under the token's caller. Under an API-key authenticator
each listener is followed as its own key names its caller now."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from support.catalogue import build_catalogue
from support.notices import PROMPTS, RESOURCES, TOOLS, UPDATED, Heard, listening
from support.procs import serving_http, stop
from support.tokens import KeyPair

from chainweaver import FlowExecutor
from chainweaver.mcp import CallerIdentity, FlowServer, GateContext, SecurityConfig, visible_claim

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


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_listener_hears_nothing_once_its_token_expired(
        server: dict[str, Any], mode: str) -> None:
    """A listen stream (or a 2025-11-25 session) was told of changes for as long as it
    stayed open, after the token it was opened with had expired: it now hears nothing
    more (the stream ends; the session waits for a request with a new token), while a
    caller whose token is still good hears on."""
    keys = server["keys"]
    lifetime = 6
    sam = keys.token("sam", ["common"], expires_in=lifetime)
    expires = time.time() + lifetime - 1  # the token's exp is whole seconds
    olga = keys.token("olga", ["common"])
    async with follower(server["url"], sam, mode) as sam_heard, \
            follower(server["url"], olga, mode) as olga_heard:
        add_flow(server["flows"], "first_extra", "common")
        assert await sam_heard.take(3) == BOTH
        assert await olga_heard.take(3) == BOTH
        assert time.time() < expires, "too slow to tell the change before the expiry"
        await asyncio.sleep(max(0.0, expires - time.time()) + 1.5)
        add_flow(server["flows"], "second_extra", "common")
        assert await olga_heard.take(3) == BOTH
        assert await sam_heard.take(0) == []


def new_version(executor: FlowExecutor, name: str) -> None:
    current = executor.registry.get_flow(name)
    major = int(current.version.split(".")[0]) + 1
    executor.registry.register_flow(dataclasses.replace(current, version=f"{major}.0.0"))


TEAMS_BY_KEY = {"key-sam": ["search-team", "orders-team"], "key-olga": ["search-team"]}


def api_key_caller(teams: dict[str, list[str]]) -> Any:
    """An authenticator naming the caller of an ``X-Api-Key`` header by the teams its
    key holds now (an operator may take a team from a key at any time)."""

    def authenticate(ctx: GateContext) -> CallerIdentity | None:
        key = ctx.headers.get("x-api-key", "")
        if key not in teams:
            return None
        return CallerIdentity(key, {"teams": list(teams[key])}, subject=key)

    return authenticate


@asynccontextmanager
async def keyed_follower(url: str, key: str, mode: str, uris: list[str]
                         ) -> AsyncIterator[Heard]:
    heard = Heard()
    transport = StreamableHttpTransport(url, headers={"X-Api-Key": key})
    if mode == "legacy":
        async with Client(transport, mode=mode, message_handler=heard) as client:
            for uri in uris:
                await client.session.subscribe_resource(uri)
            yield heard
        return
    async with Client(transport) as client, listening(client.session, heard, uris):
        yield heard


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_listener_is_followed_as_its_key_names_its_caller_now(mode: str) -> None:
    """Over HTTP an authenticator reads each listener's own headers when it is asked
    again: when sam's key loses the search team, sam's stream (opened while it had it)
    hears nothing more of ``product_search``; olga's, whose key keeps it, still does."""
    teams = {key: list(held) for key, held in TEAMS_BY_KEY.items()}
    executor = build_catalogue()
    server = FlowServer(executor, expose_schemas=True, security=SecurityConfig(
        authenticator=api_key_caller(teams), visible=visible_claim("teams")))
    uri = "chainweaver://flows/product_search/schema"
    async with serving_http(server) as url, \
            keyed_follower(url, "key-sam", mode, [uri]) as sam, \
            keyed_follower(url, "key-olga", mode, [uri]) as olga:
        new_version(executor, "product_search")
        told = sorted([TOOLS, f"{UPDATED} {uri}"])
        assert await sam.take(2) == told and await olga.take(2) == told
        teams["key-sam"] = ["orders-team"]
        new_version(executor, "product_search")
        assert await olga.take(2) == told
        assert await sam.take(0) == []
