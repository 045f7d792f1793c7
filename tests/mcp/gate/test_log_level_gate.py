"""``logging/setLevel`` (2025-11-25) passes the security gate like the subscriptions:
it subscribes the session to run log messages. It used to be served to anyone, never
authenticated, rate-limited or audited, and a level set by a caller the gate refused
was kept for the session."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue

from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FixedWindowRateLimiter,
    FlowServer,
    GateContext,
    SecurityConfig,
)

pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore:The logging capability is deprecated")]
METHOD = "logging/setLevel"


class Door:
    """An authenticator the test opens and shuts (in memory there are no headers)."""

    def __init__(self) -> None:
        self.open = False

    def __call__(self, ctx: GateContext) -> CallerIdentity | None:
        return CallerIdentity("sam", subject="sam") if self.open else None


def serving(**security: Any) -> tuple[FlowServer, Door, list[AuditEvent]]:
    events: list[AuditEvent] = []
    door = Door()
    server = FlowServer(build_catalogue(), security=SecurityConfig(
        authenticator=door, audit_hook=events.append, **security))
    return server, door, events


def audited(events: list[AuditEvent]) -> list[tuple[Any, ...]]:
    return [(e.phase, e.kind, e.name, e.caller_id, e.decision, e.reason) for e in events
            if e.name == METHOD]


async def test_an_unauthenticated_set_level_is_refused_audited_and_not_kept() -> None:
    server, door, events = serving()
    logs: list[Any] = []

    async def on_log(message: Any) -> None:
        logs.append(message)

    async with Client(server.fastmcp, mode="legacy", log_handler=on_log) as client:
        with pytest.raises(MCPError) as refused:
            await client.set_logging_level("debug")
        assert refused.value.error.code == GATE_REFUSED
        assert refused.value.error.data == {"reason": "unauthenticated"}
        door.open = True
        await client.call_tool("product_search", {"query": "lamp"})
        assert logs == []  # the refused request set no level for the session
        await client.set_logging_level("debug")
        await client.call_tool("product_search", {"query": "lamp"})
        assert logs  # an admitted one does
    assert audited(events) == [
        ("decision", "subscription", METHOD, None, "denied", "unauthenticated"),
        ("decision", "subscription", METHOD, "sam", "allowed", "ok"),
        ("completed", "subscription", METHOD, "sam", "allowed", "ok")]


async def test_set_level_counts_against_the_callers_rate_budget() -> None:
    server, door, events = serving(rate_limiter=FixedWindowRateLimiter(1, 3600))
    door.open = True
    async with Client(server.fastmcp, mode="legacy") as client:
        await client.set_logging_level("info")
        with pytest.raises(MCPError) as refused:
            await client.set_logging_level("debug")
    assert refused.value.error.data == {"reason": "rate_limited"}
    assert audited(events)[-1] == ("decision", "subscription", METHOD, "sam", "denied",
                                   "rate_limited")
