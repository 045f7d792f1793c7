"""The security gate on ``tools/call``, end to end through a real MCP client:
authenticate -> rate-limit -> authorize -> audit."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import CALLS, build_catalogue

from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    AuthorizationDecision,
    CallerIdentity,
    FixedWindowRateLimiter,
    FlowServer,
    GateContext,
    SecurityConfig,
)

SECRET_QUERY = "zebra-7781-private"


class FakeClock:
    """A monotonic clock the test moves by hand, so windows expire without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Caller:
    """An authenticator whose answer the test switches between calls."""

    def __init__(self, identity: str | None = "alice") -> None:
        self.identity = identity
        self.seen: list[GateContext] = []

    def __call__(self, ctx: GateContext) -> CallerIdentity | None:
        self.seen.append(ctx)
        return CallerIdentity(self.identity) if self.identity else None


def server_with(**security: Any) -> tuple[FlowServer, list[AuditEvent]]:
    """A catalogue server whose SecurityConfig has ``security`` (audit into a list)."""
    events: list[AuditEvent] = []
    security.setdefault("audit_hook", events.append)
    return FlowServer(build_catalogue(), security=SecurityConfig(**security)), events


async def refusal(client: Client, name: str, arguments: dict[str, Any]) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await client.call_tool(name, arguments, raise_on_error=False)
    assert caught.value.error.code == GATE_REFUSED
    return caught.value


def assert_only_reason(error: MCPError, reason: str) -> None:
    """A refusal tells the client the reason code and nothing else."""
    assert error.error.message == f"Request refused: {reason}"
    assert error.error.data == {"reason": reason}


def flow_events(events: list[AuditEvent]) -> list[AuditEvent]:
    """The events of calls, reads and renders (not of the lists a client makes itself)."""
    return [event for event in events if event.kind not in ("list", "completion")]


def event_text(event: AuditEvent) -> str:
    return " ".join(str(value) for value in dataclasses.asdict(event).values())


# ----------------------------------------------------------------------- audit


@pytest.mark.anyio
async def test_an_allowed_call_is_audited_with_a_hash_of_the_result_never_its_content() -> None:
    server, events = server_with(authenticator=Caller("alice"))
    started = time.time()
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("product_search", {"query": SECRET_QUERY})
    finished = time.time()
    text = result.content[0].text
    assert SECRET_QUERY in text  # the output echoes the argument...

    decision, completed = flow_events(events)
    for event in flow_events(events):
        assert started <= event.timestamp <= finished
        assert (event.kind, event.name) == ("tool", "product_search")
        assert (event.flow_name, event.flow_version) == ("product_search", "1.0.0")
        assert event.caller_id == "alice"
        assert (event.decision, event.reason) == ("allowed", "ok")
        assert SECRET_QUERY not in event_text(event)  # ...but no audit event does
        assert text not in event_text(event)
    assert decision.phase == "decision"
    assert decision.duration_ms is None and decision.result_sha256 is None
    assert completed.phase == "completed"
    assert completed.outcome == "ok"
    assert completed.duration_ms is not None and completed.duration_ms >= 0
    assert completed.result_sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert completed.result_length == len(text.encode("utf-8"))


@pytest.mark.anyio
async def test_a_failed_flow_is_audited_as_an_error_without_its_message() -> None:
    server, events = server_with(error_detail="full")
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("failing_flow", {"query": SECRET_QUERY},
                                        raise_on_error=False)
    assert result.is_error and "hunter2" in result.content[0].text
    completed = events[-1]
    assert completed.phase == "completed" and completed.outcome == "error"
    assert completed.caller_id == "anonymous"  # no authenticator configured
    assert completed.result_sha256 == hashlib.sha256(
        result.content[0].text.encode("utf-8")).hexdigest()
    for event in events:
        assert "hunter2" not in event_text(event)
        assert SECRET_QUERY not in event_text(event)


@pytest.mark.anyio
async def test_a_refused_call_is_audited_once_as_denied() -> None:
    server, events = server_with(authenticator=Caller(None))
    async with Client(server.fastmcp) as client:
        await refusal(client, "product_search", {"query": SECRET_QUERY})
    (event,) = events
    assert (event.phase, event.decision, event.reason) == ("decision", "denied",
                                                           "unauthenticated")
    assert event.caller_id is None
    assert event.result_sha256 is None and event.duration_ms is None
    assert SECRET_QUERY not in event_text(event)


@pytest.mark.anyio
async def test_list_requests_are_audited_without_a_flow_or_a_result_hash() -> None:
    server, events = server_with(authenticator=Caller("alice"))
    async with Client(server.fastmcp) as client:
        await client.list_tools()
    decision, completed = events
    for event in events:
        assert (event.kind, event.name, event.caller_id) == ("list", "tools/list", "alice")
        assert event.flow_name is None and event.result_sha256 is None
    assert (decision.phase, completed.phase, completed.outcome) == (
        "decision", "completed", "ok")


@pytest.mark.anyio
@pytest.mark.parametrize("flavour", ["sync", "async", "slow"])
async def test_a_broken_audit_hook_never_breaks_a_call(flavour: str) -> None:
    attempts: list[AuditEvent] = []

    def broken(event: AuditEvent) -> None:
        attempts.append(event)
        raise RuntimeError("audit sink is down")

    async def broken_async(event: AuditEvent) -> None:
        attempts.append(event)
        raise RuntimeError("audit sink is down")

    async def stuck(event: AuditEvent) -> None:
        attempts.append(event)
        await asyncio.sleep(600)

    hook = {"sync": broken, "async": broken_async, "slow": stuck}[flavour]
    server = FlowServer(
        build_catalogue(),
        security=SecurityConfig(audit_hook=hook, hook_timeout=0.1),
    )
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("price_quote", {"sku": "SKU-1", "quantity": 2})
        assert result.structured_content == {"sku": "SKU-1", "total_cents": 1998}
        failed = await client.call_tool("failing_flow", {"query": "x"}, raise_on_error=False)
        assert failed.is_error
    assert [e.phase for e in flow_events(attempts)] == ["decision", "completed"] * 2


@pytest.mark.anyio
async def test_an_async_audit_hook_receives_every_event() -> None:
    events: list[AuditEvent] = []

    async def hook(event: AuditEvent) -> None:
        await asyncio.sleep(0)
        events.append(event)

    server = FlowServer(build_catalogue(), security=SecurityConfig(audit_hook=hook))
    async with Client(server.fastmcp) as client:
        await client.call_tool("price_quote", {"sku": "SKU-1"})
    assert [e.phase for e in flow_events(events)] == ["decision", "completed"]


# --------------------------------------------------------------- authenticator


@pytest.mark.anyio
async def test_the_authenticator_sees_the_request_context() -> None:
    caller = Caller("alice")
    server, _ = server_with(authenticator=caller)
    async with Client(server.fastmcp) as client:
        await client.call_tool("order_status", {"order_id": "A-3"})
    (ctx,) = [ctx for ctx in caller.seen if ctx.kind == "tool"]
    assert (ctx.kind, ctx.name) == ("tool", "order_status")
    # The target is resolved only once the caller is known, in that caller's view.
    assert (ctx.flow_name, ctx.flow_version) == (None, None)
    assert dict(ctx.headers) == {}  # in memory there is no HTTP request
    assert ctx.caller is None  # not yet authenticated
    assert "A-3" not in repr(ctx)  # argument values are never handed to hooks


@pytest.mark.anyio
async def test_no_identity_refuses_and_nothing_runs() -> None:
    server, _ = server_with(authenticator=Caller(None))
    before = CALLS.copy()
    async with Client(server.fastmcp) as client:
        assert_only_reason(await refusal(client, "product_search", {"query": "q"}),
                           "unauthenticated")
    assert CALLS == before


@pytest.mark.anyio
async def test_an_authenticator_that_raises_refuses_without_leaking_its_error() -> None:
    def authenticator(ctx: GateContext) -> CallerIdentity:
        raise PermissionError("token store password is hunter2")

    server, events = server_with(authenticator=authenticator)
    before = CALLS.copy()
    async with Client(server.fastmcp) as client:
        error = await refusal(client, "product_search", {"query": "q"})
    assert_only_reason(error, "authenticator_error")
    assert "hunter2" not in str(error) and "hunter2" not in event_text(events[0])
    assert CALLS == before


@pytest.mark.anyio
async def test_an_authenticator_returning_the_wrong_type_refuses() -> None:
    server, _ = server_with(authenticator=lambda ctx: "alice")
    async with Client(server.fastmcp) as client:
        assert_only_reason(await refusal(client, "price_quote", {"sku": "S"}),
                           "authenticator_error")


@pytest.mark.anyio
async def test_async_authenticators_are_awaited_and_bounded_by_hook_timeout() -> None:
    async def slow_ok(ctx: GateContext) -> CallerIdentity:
        await asyncio.sleep(0)
        return CallerIdentity("async-alice")

    async def stuck(ctx: GateContext) -> CallerIdentity:
        await asyncio.sleep(600)
        return CallerIdentity("never")

    server, events = server_with(authenticator=slow_ok)
    async with Client(server.fastmcp) as client:
        await client.call_tool("price_quote", {"sku": "S"})
    assert events[-1].caller_id == "async-alice"

    server, _ = server_with(authenticator=stuck, hook_timeout=0.1)
    async with Client(server.fastmcp) as client:
        assert_only_reason(await refusal(client, "price_quote", {"sku": "S"}),
                           "authenticator_error")


# ---------------------------------------------------------------- rate limiter


@pytest.mark.anyio
async def test_rate_limit_per_caller_per_window_with_an_injected_clock() -> None:
    clock = FakeClock()
    caller = Caller("alice")
    limiter = FixedWindowRateLimiter(3, window_seconds=10, clock=clock)
    server, events = server_with(authenticator=caller, rate_limiter=limiter)
    async with Client(server.fastmcp) as client:
        await client.list_tools()  # lists count too (the client would list on its own)
        for _ in range(2):
            await client.call_tool("price_quote", {"sku": "S"})
        error = await refusal(client, "product_search", {"query": "q"})
        assert_only_reason(error, "rate_limited")
        assert events[-1].caller_id == "alice" and events[-1].decision == "denied"

        caller.identity = "bob"  # another caller has a budget of its own
        await client.call_tool("price_quote", {"sku": "S"})

        caller.identity = "alice"
        clock.now += 9.9  # still inside alice's window
        await refusal(client, "price_quote", {"sku": "S"})
        clock.now += 0.1  # next window
        result = await client.call_tool("price_quote", {"sku": "S"})
        assert not result.is_error


@pytest.mark.anyio
async def test_rate_limit_per_name_gives_each_tool_its_own_budget() -> None:
    limiter = FixedWindowRateLimiter(1, window_seconds=60, per_name=True, clock=FakeClock())
    server, _ = server_with(rate_limiter=limiter)
    async with Client(server.fastmcp) as client:
        await client.call_tool("price_quote", {"sku": "S"})
        await client.call_tool("product_search", {"query": "q"})
        assert_only_reason(await refusal(client, "price_quote", {"sku": "S"}),
                           "rate_limited")


def test_rate_limiter_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        FixedWindowRateLimiter(0)
    with pytest.raises(ValueError):
        FixedWindowRateLimiter(1, window_seconds=0)


@pytest.mark.anyio
async def test_the_gate_runs_in_order_and_stops_at_the_first_refusal() -> None:
    caller = Caller(None)
    authorized: list[GateContext] = []

    def authorizer(ctx: GateContext) -> bool:
        authorized.append(ctx)
        return True

    limiter = FixedWindowRateLimiter(2, window_seconds=60, clock=FakeClock())
    server, _ = server_with(authenticator=caller, rate_limiter=limiter, authorizer=authorizer)
    async with Client(server.fastmcp) as client:
        # Refused by authentication: the rate budget is untouched, the authorizer not asked.
        await refusal(client, "price_quote", {"sku": "S"})
        assert authorized == []
        caller.identity = "alice"
        await client.list_tools()  # a list takes a unit of the budget, never the authorizer
        assert authorized == []
        await client.call_tool("price_quote", {"sku": "S"})
        assert len(authorized) == 1
        # Refused by the limiter: the authorizer is not asked.
        assert_only_reason(await refusal(client, "price_quote", {"sku": "S"}),
                           "rate_limited")
        assert len(authorized) == 1


# ------------------------------------------------------------------ authorizer


@pytest.mark.anyio
async def test_the_authorizer_sees_the_authenticated_caller() -> None:
    seen: list[GateContext] = []

    def authorizer(ctx: GateContext) -> bool:
        seen.append(ctx)
        return True

    server, _ = server_with(authenticator=Caller("alice"), authorizer=authorizer)
    async with Client(server.fastmcp) as client:
        await client.call_tool("order_status", {"order_id": "A-3"})
    (ctx,) = seen
    assert ctx.caller == CallerIdentity("alice")
    assert (ctx.flow_name, ctx.flow_version) == ("order_status", "2.1.0")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (lambda ctx: False, "forbidden"),
        (lambda ctx: AuthorizationDecision(False, "outside_business_hours"),
         "outside_business_hours"),
        (lambda ctx: "yes", "forbidden"),  # only True or an allowing decision admits
        (lambda ctx: None, "forbidden"),
        (lambda ctx: 1 / 0, "authorizer_error"),
    ],
)
async def test_authorizer_refusals_send_only_the_reason_code(
    answer: Callable[[GateContext], Any], reason: str
) -> None:
    server, events = server_with(authenticator=Caller("alice"), authorizer=answer)
    before = CALLS.copy()
    async with Client(server.fastmcp) as client:
        assert_only_reason(await refusal(client, "product_search", {"query": SECRET_QUERY}),
                           reason)
    assert CALLS == before
    (event,) = events
    assert (event.decision, event.reason, event.caller_id) == ("denied", reason, "alice")


@pytest.mark.anyio
async def test_an_authorizer_can_allow_per_flow() -> None:
    async def only_quotes(ctx: GateContext) -> AuthorizationDecision:
        return AuthorizationDecision(ctx.flow_name == "price_quote", "not_your_flow")

    server, _ = server_with(authorizer=only_quotes)
    async with Client(server.fastmcp) as client:
        quote = await client.call_tool("price_quote", {"sku": "S"})
        assert quote.structured_content["total_cents"] == 999
        assert_only_reason(await refusal(client, "order_status", {"order_id": "A-1"}),
                           "not_your_flow")


# --------------------------------------------------- excluded and unknown names


@pytest.mark.anyio
async def test_hooks_cannot_tell_an_excluded_flow_from_an_unknown_name() -> None:
    caller = Caller("alice")
    authorized: list[GateContext] = []

    def authorizer(ctx: GateContext) -> bool:
        authorized.append(ctx)
        return True

    server, events = server_with(authenticator=caller, authorizer=authorizer)
    async with Client(server.fastmcp) as client:
        excluded = await client.call_tool("write_flow", {"query": "q"},
                                          raise_on_error=False)
        unknown = await client.call_tool("nope", {"query": "q"}, raise_on_error=False)
    assert excluded.is_error and unknown.is_error
    for ctx in [*caller.seen, *authorized]:
        assert ctx.flow_name is None and ctx.flow_version is None
    assert [ctx.name for ctx in caller.seen] == ["write_flow", "nope"]

    def shape(event: AuditEvent) -> dict[str, Any]:
        fields = dataclasses.asdict(event)
        for varying in ("timestamp", "name", "duration_ms", "result_sha256",
                        "result_length"):
            fields.pop(varying)
        return fields

    by_name = {name: [shape(e) for e in events if e.name == name]
               for name in ("write_flow", "nope")}
    assert by_name["write_flow"] == by_name["nope"]
    assert [e["flow_name"] for e in by_name["write_flow"]] == [None, None]


@pytest.mark.anyio
async def test_refusals_for_excluded_and_unknown_names_are_identical() -> None:
    server, _ = server_with(authorizer=lambda ctx: False)
    async with Client(server.fastmcp) as client:
        excluded = await refusal(client, "write_flow", {"query": "q"})
        unknown = await refusal(client, "nope", {"query": "q"})
    assert excluded.error.model_dump() == unknown.error.model_dump()


def test_rate_limiter_memory_is_pruned_even_when_every_key_is_new() -> None:
    clock = FakeClock()
    limiter = FixedWindowRateLimiter(1, window_seconds=1, per_name=True, clock=clock)
    for window in range(30):
        clock.now = float(window)
        for n in range(1_000):  # invented names: each key is seen once, never again
            assert limiter.acquire(CallerIdentity("mallory"), f"made-up-{window}-{n}")
    # Only the current window's counters are kept, never all 30,000 keys.
    assert limiter.tracked_keys == 1_000
