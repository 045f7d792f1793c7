"""Two tokens never share a caller id. The gate's id of a verified token is
``client_id|sub``; a ``|`` in either part once made two different principals one caller
(client ``a|b`` with subject ``c`` and client ``a`` with subject ``b|c`` were both
``a|b|c``; client ``a|b`` without a subject and client ``a`` with subject ``b`` both
``a|b``), so each read the other's runs and outputs, continued its approvals and spent
its rate budget. Over streamable HTTP on 127.0.0.1 with JWT bearer tokens, on both eras
(the second adversarial pass of issue 32)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.server.auth.providers.jwt import JWTVerifier
from mcp import MCPError
from support.procs import serving_http
from support.run_records import run_catalogue
from support.tokens import AUDIENCE, ISSUER, KeyPair

from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate.admission import token_caller_id

pytestmark = pytest.mark.anyio

# (victim's client_id, subject), (other's client_id, subject): one id before the fix.
PAIRS = [(("a|b", "c"), ("a", "b|c")), (("a|b", None), ("a", "b")),
         (("a%7Cb", "c"), ("a|b", "c"))]


def test_no_two_tokens_share_a_caller_id() -> None:
    tokens = [token for pair in PAIRS for token in pair] + [
        ("a", None), ("a", "b"), ("a|", "b"), ("a", "|b"), ("a%", "b"), ("a%25", "b")]
    ids = [token_caller_id(client, subject) for client, subject in tokens]
    assert len(set(ids)) == len(set(tokens))
    # Ordinary ids read as they always did; subjects are kept (auth0|1234).
    assert token_caller_id("web", "auth0|1234") == "web|auth0|1234"
    assert token_caller_id("web", None) == "web"


@asynccontextmanager
async def serving(keys: KeyPair, audit: list[AuditEvent]) -> AsyncIterator[str]:
    server = FlowServer(run_catalogue(), security=SecurityConfig(
        auth=JWTVerifier(public_key=keys.public_pem, issuer=ISSUER, audience=AUDIENCE),
        audit_hook=audit.append),
        run_history=RunHistory(output_limit=10))
    async with serving_http(server) as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_pipe_in_a_client_id_or_subject_never_reaches_another_callers_runs(
        mode: str) -> None:
    keys = KeyPair()
    audit: list[AuditEvent] = []

    def client(url: str, client_id: str, subject: str | None) -> Client:
        claims: dict[str, Any] = {"client_id": client_id}
        if subject is None:
            claims["sub"] = None  # PyJWT leaves out nothing: the verifier sees no subject
        token = keys.token(subject or "", [], **claims)
        return Client(StreamableHttpTransport(url, headers={
            "Authorization": f"Bearer {token}"}), mode=mode)

    async with serving(keys, audit) as url:
        for victim, other in PAIRS:
            async with client(url, *victim) as as_victim:
                called = await as_victim.session.call_tool("flow1", {"text": "private"})
                run_id = called.meta["chainweaver"]["run_id"]
                output = called.meta["chainweaver"]["output"]["uri"]
            async with client(url, *other) as as_other:
                listed = json.loads((await as_other.read_resource(
                    "chainweaver://runs"))[0].text)
                assert run_id not in [run["run_id"] for run in listed["runs"]], (victim,
                                                                                 other)
                for uri in (f"chainweaver://runs/{run_id}", output):
                    with pytest.raises(MCPError, match="Resource not found"):
                        await as_other.read_resource(uri)
            async with client(url, *victim) as as_victim:  # still the victim's own
                assert (await as_victim.read_resource(output))[0].text == \
                    '{"text": "PRIVATE"}'
    callers = {event.caller_id for event in audit if event.kind == "tool"}
    assert len(callers) == len(PAIRS)  # one caller per victim token, each its own id
