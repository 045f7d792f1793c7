"""The run-records property over streamable HTTP on 127.0.0.1, with JWT bearer tokens
(each caller its own token, its teams in a claim), on both eras, on the in-memory and
the Redis store (see tests/support/run_records.py). Six callers: three with overlapping
and disjoint views, three with none (the hostile caller ids, ten of them, are
tests/mcp/runs/test_run_records_property.py's).

The store sits below the protocol (both stores answer both eras alike, and run
notices come from the serving process, not the store), so each era runs on one store
here: every pair of transport, era and store is covered once, with the in-memory
client's runs of tests/mcp/runs/test_run_records_property.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.auth.providers.jwt import JWTVerifier
from support.procs import free_port, serving_http
from support.run_records import (
    check_isolation,
    check_subscriptions,
    grants,
    run_catalogue,
    start_runs,
)
from support.tokens import AUDIENCE, ISSUER, KeyPair

from chainweaver.mcp import FlowServer, SecurityConfig, visible_claim
from chainweaver.mcp.config import RunHistory


@asynccontextmanager
async def serving(keys: KeyPair, store: str) -> AsyncIterator[str]:
    server = FlowServer(run_catalogue(), security=SecurityConfig(
        auth=JWTVerifier(public_key=keys.public_pem, issuer=ISSUER, audience=AUDIENCE),
        visible=visible_claim("teams")),
        run_history=RunHistory(store=store, prefix=f"http:{free_port()}"))
    async with serving_http(server) as url:
        yield url


@pytest.mark.anyio
@pytest.mark.parametrize(("store", "mode"), [("memory", "auto"), ("redis", "legacy")])
async def test_no_caller_sees_another_callers_runs_over_http(
        mode: str, store: str, request: pytest.FixtureRequest) -> None:
    keys = KeyPair()
    given = grants(7, 6)
    url_of_store = "memory://" if store == "memory" else request.getfixturevalue("redis_url")
    async with serving(keys, url_of_store) as url:
        @asynccontextmanager
        async def connect(who: str, handler: Any = None) -> AsyncIterator[Client]:
            token = keys.token(who, given[who])
            transport = StreamableHttpTransport(url, headers={
                "Authorization": f"Bearer {token}"})
            async with Client(transport, mode=mode, message_handler=handler) as client:
                yield client

        runs = await start_runs(connect, given)
        await check_isolation(connect, given, runs)
        await check_subscriptions(connect, lambda who: None, given, runs, mode)
        for who, teams in given.items():
            given[who] = teams[1:]  # the next tokens carry fewer teams
        await check_isolation(connect, given, runs)
