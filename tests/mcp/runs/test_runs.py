"""Runs that talk back, through a real in-memory MCP client on both protocol eras:
per-step progress and log messages, cancellation, and approval through elicitation
(2025-11-25) or input_required (2026-07-28), every approval decision audited."""

from __future__ import annotations

import asyncio
from typing import Any, Literal, cast

import pytest
from fastmcp import Client
from mcp import MCPError
from mcp_types import LOG_LEVEL_META_KEY
from pydantic import BaseModel
from support.mcp_client import raw_call

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import ExposurePolicy, FlowServer, SecurityConfig, ServingConfig
from chainweaver.mcp.runs.approval import (
    APPROVAL_KEY,
    Approval,
    ApprovalNonces,
    RunSettings,
)

ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
READ = ToolSafetyContract("read")
APPROVAL = ToolSafetyContract("write", requires_approval=True, approval_reason="charges a card")
SECRET = "4111-1111"  # an argument value: must never appear in a notification


class Order(BaseModel):
    card: str
    cents: int


class Stage(BaseModel):
    card: str
    cents: int
    stage: int = 0


CHARGED: list[int] = []
STARTED: list[str] = []


@tool(safety=READ)
def validate(order: Order) -> Stage:
    return Stage(card=order.card, cents=order.cents, stage=1)


@tool(safety=READ)
async def price(stage: Stage) -> Stage:
    return Stage(card=stage.card, cents=stage.cents + 1, stage=2)


@tool(safety=READ)
def summarize(stage: Stage) -> Stage:
    STARTED.append("summarize")
    return Stage(card=stage.card, cents=stage.cents, stage=3)


@tool(safety=READ)
def broken(stage: Stage) -> Stage:
    raise RuntimeError(f"card {stage.card} rejected")


@tool(safety=APPROVAL)
def charge(stage: Stage) -> Stage:
    CHARGED.append(stage.cents)
    return stage


@tool(safety=READ)
async def hang(stage: Stage) -> Stage:
    STARTED.append("hang")
    await asyncio.sleep(60)
    return stage


def build_server(approval: Literal["exclude", "elicit"] = "exclude",
                 state_keys: list[str] | None = None,
                 **options: Any) -> tuple[FlowServer, list[Any]]:
    CHARGED.clear()
    STARTED.clear()
    executor = FlowExecutor(FlowRegistry())
    for t in (validate, price, summarize, broken, charge, hang):
        executor.register_tool(t)
    register = executor.registry.register_flow
    register(Flow("checkout", "three steps", [FlowStep("validate"), FlowStep("price"),
                                              FlowStep("summarize")]))
    register(Flow("failing", "fails in step 2", [FlowStep("validate"), FlowStep("broken"),
                                                 FlowStep("summarize")]))
    register(Flow("pay", "charges a card", [FlowStep("validate"), FlowStep("charge")]))
    register(Flow("stuck", "hangs in step 2", [FlowStep("validate"), FlowStep("hang"),
                                               FlowStep("summarize")]))
    audit: list[Any] = []
    options.setdefault("policy", ExposurePolicy(allowed_side_effects=["none", "read", "write"],
                                                approval=approval))
    server = FlowServer(executor, security=SecurityConfig(audit_hook=audit.append,
                                                          request_state_keys=state_keys),
                        **options)
    return server, audit


ORDER = {"card": SECRET, "cents": 100}


class Seen:
    """What a client's handlers received."""

    def __init__(self, answer: Any = None) -> None:
        self.progress: list[tuple[float, float | None, str | None]] = []
        self.logs: list[tuple[str, str]] = []
        self.asked: list[str] = []
        self.answer = answer

    async def on_progress(self, progress: float, total: float | None,
                          message: str | None) -> None:
        self.progress.append((progress, total, message))

    async def on_log(self, message: Any) -> None:
        self.logs.append((message.level, message.data["msg"]))

    async def on_elicit(self, message: str, response_type: Any, params: Any,
                        context: Any) -> Any:
        self.asked.append(message)
        return self.answer

    def client(self, server: FlowServer, mode: str, *, elicit: bool = True) -> Client:
        return Client(server.fastmcp, mode=mode, progress_handler=self.on_progress,
                      log_handler=self.on_log,
                      elicitation_handler=self.on_elicit if elicit else None)


# ------------------------------------------------------------------ progress and logs


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_progress_after_every_step(mode: str) -> None:
    server, _ = build_server()
    seen = Seen()
    async with seen.client(server, mode) as client:
        result = await client.call_tool("checkout", ORDER)
    assert result.structured_content == {"card": SECRET, "cents": 101, "stage": 3}
    assert seen.progress == [(1, 3, "step 'validate' completed"),
                             (2, 3, "step 'price' completed"),
                             (3, 3, "step 'summarize' completed")]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_an_operator_can_switch_run_notifications_off(mode: str) -> None:
    server, _ = build_server(serving=ServingConfig(run_notifications=False))
    seen = Seen()
    async with seen.client(server, mode) as client:
        if mode == "legacy":
            await client.set_logging_level("debug")
        result = await client.call_tool("checkout", ORDER)
    assert result.structured_content == {"card": SECRET, "cents": 101, "stage": 3}
    assert seen.progress == [] and seen.logs == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_no_progress_without_a_progress_token(mode: str) -> None:
    server, _ = build_server()
    seen = Seen()
    async with Client(server.fastmcp, mode=mode, log_handler=seen.on_log) as client:
        raw = await client.session.call_tool("checkout", ORDER)  # no progress callback
    assert raw.is_error is False and seen.progress == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_logs_say_what_ran_never_values(mode: str) -> None:
    server, _ = build_server()
    seen = Seen()
    async with seen.client(server, mode) as client:
        if mode == "legacy":
            await client.set_logging_level("debug")
        await client.call_tool("checkout", ORDER)
        assert seen.logs == [
            ("info", "step 'validate' started"), ("info", "step 'validate' completed"),
            ("info", "step 'price' started"), ("info", "step 'price' completed"),
            ("info", "step 'summarize' started"), ("info", "step 'summarize' completed")]
        seen.logs.clear()
        failed = await client.call_tool("failing", ORDER, raise_on_error=False)
    assert failed.is_error
    assert ("error", "step 'broken' failed (RuntimeError)") in seen.logs
    assert seen.logs[-1] == ("error", "flow 'failing' failed (RuntimeError)")
    assert not any(SECRET in text or "101" in text for _, text in seen.logs)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_no_logs_unless_the_client_asked(mode: str) -> None:
    # 2025-11-25: no logging/setLevel; 2026-07-28: a level above all of a run's messages
    # (a FastMCP client asks for "debug" unless the call's own _meta says otherwise).
    server, _ = build_server()
    seen = Seen()
    meta = None if mode == "legacy" else {LOG_LEVEL_META_KEY: "emergency"}
    async with seen.client(server, mode) as client:
        failed = await client.call_tool("failing", ORDER, raise_on_error=False, meta=meta)
    assert failed.is_error and seen.logs == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_logs_follow_the_level_the_client_set(mode: str) -> None:
    server, _ = build_server()
    seen = Seen()
    # 2025-11-25: logging/setLevel; 2026-07-28: the level in each request's _meta.
    meta = None if mode == "legacy" else {LOG_LEVEL_META_KEY: "error"}
    async with seen.client(server, mode) as client:
        if mode == "legacy":
            await client.set_logging_level("error")
        await client.call_tool("checkout", ORDER, meta=meta)
        await client.call_tool("failing", ORDER, raise_on_error=False, meta=meta)
    assert seen.logs and all(level == "error" for level, _ in seen.logs)


@pytest.mark.anyio
async def test_retries_are_logged_as_warnings() -> None:
    from chainweaver import RetryPolicy

    attempts: list[int] = []

    @tool(safety=READ)
    def wobbly(order: Order) -> Order:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("again")
        return order

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(wobbly)
    executor.registry.register_flow(Flow("wobble", "retried", [FlowStep(
        "wobbly", retry=RetryPolicy(max_attempts=2, backoff_seconds=0,
                                    retry_on=("ConnectionError",)))]))
    seen = Seen()
    async with seen.client(FlowServer(executor), "auto") as client:
        await client.call_tool("wobble", ORDER)
    assert ("warning", "step 'wobbly' attempt 1 failed (ConnectionError); retrying") \
        in seen.logs


@pytest.mark.anyio
async def test_generic_error_detail_hides_error_types_in_logs() -> None:
    from chainweaver.mcp import SecurityConfig as Security

    executor = FlowExecutor(FlowRegistry())
    for t in (validate, broken, summarize):
        executor.register_tool(t)
    executor.registry.register_flow(Flow("failing", "fails", [
        FlowStep("validate"), FlowStep("broken"), FlowStep("summarize")]))
    seen = Seen()
    server = FlowServer(executor, security=Security(error_detail="generic"))
    async with seen.client(server, "auto") as client:
        await client.call_tool("failing", ORDER, raise_on_error=False)
    assert ("error", "step 'broken' failed") in seen.logs
    assert not any("RuntimeError" in text for _, text in seen.logs)


# ------------------------------------------------------------------ cancellation


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_client_cancellation_stops_the_run_and_is_audited(mode: str) -> None:
    server, audit = build_server()
    async with Client(server.fastmcp, mode=mode) as client:
        call = asyncio.ensure_future(client.call_tool("stuck", ORDER))
        for _ in range(200):  # bounded: until the hanging step runs
            if "hang" in STARTED:
                break
            await asyncio.sleep(0.01)
        assert "hang" in STARTED
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        for _ in range(200):
            if any(event.outcome == "cancelled" for event in audit):
                break
            await asyncio.sleep(0.01)
        # The server still answers, and the later step never started.
        assert (await client.call_tool("checkout", ORDER)).is_error is False
    completed = [e for e in audit if e.phase == "completed" and e.name == "stuck"]
    assert [e.outcome for e in completed] == ["cancelled"]
    assert STARTED.count("summarize") == 1  # from the checkout call only


# ------------------------------------------------------------------ approval


def test_exposure_report_and_meta_say_a_flow_needs_approval() -> None:
    default, _ = build_server()
    assert "pay" not in default.registered_tool_names
    (pay,) = [r for r in default.exposure_report() if r.flow_name == "pay"]
    assert not pay.exposed and "requires approval" in (pay.reason or "")
    server, _ = build_server(approval="elicit")
    report = {r.flow_name: r for r in server.exposure_report()}
    assert report["pay"].exposed and report["pay"].needs_approval
    assert report["pay"].to_dict()["needs_approval"] is True
    assert not report["checkout"].needs_approval


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_tool_meta_says_it_needs_approval(mode: str) -> None:
    server, _ = build_server(approval="elicit")
    async with Client(server.fastmcp, mode=mode) as client:
        tools = {t.name: t for t in await client.list_tools()}
    assert tools["pay"].meta["chainweaver"]["needs_approval"] is True
    assert tools["pay"].meta["chainweaver"]["safety"]["approval_reason"] == "charges a card"
    assert tools["checkout"].meta["chainweaver"]["needs_approval"] is False


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_approved_run_goes_on(mode: str) -> None:
    server, audit = build_server(approval="elicit")
    seen = Seen({"approve": True})
    async with seen.client(server, mode) as client:
        result = await client.call_tool("pay", ORDER)
    assert result.structured_content == {"card": SECRET, "cents": 100, "stage": 1}
    assert CHARGED == [100]
    (message,) = seen.asked
    for part in ("'pay'", "'charge'", "'write'", "charges a card"):
        assert part in message
    approvals = [e for e in audit if e.phase == "approval"]
    assert [(e.decision, e.reason, e.step_id, e.flow_name, e.caller_id)
            for e in approvals] == [("allowed", "accept", "charge", "pay", "anonymous")]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize(("answer", "outcome"), [
    ({"approve": False}, "decline"),
    ("decline", "decline"),
    ("cancel", "cancel"),
])
async def test_refused_run_stops_before_any_side_effect(mode: str, answer: Any,
                                                        outcome: str) -> None:
    from fastmcp.client.elicitation import ElicitResult

    server, audit = build_server(approval="elicit")
    seen = Seen(answer if isinstance(answer, dict) else ElicitResult(action=answer))
    async with seen.client(server, mode) as client:
        result = await client.call_tool("pay", ORDER, raise_on_error=False)
    assert result.is_error and CHARGED == []
    text = result.content[0].text
    assert text.startswith("ApprovalDenied: flow 'pay'") and "step 'charge'" in text
    assert f"(answer: {outcome})" in text
    assert [(e.decision, e.reason) for e in audit if e.phase == "approval"] == [
        ("denied", outcome)]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_that_cannot_be_asked_gets_an_error(mode: str) -> None:
    server, audit = build_server(approval="elicit")
    seen = Seen()
    async with seen.client(server, mode, elicit=False) as client:
        result = await client.call_tool("pay", ORDER, raise_on_error=False)
    assert result.is_error and "(answer: unavailable)" in result.content[0].text
    assert CHARGED == [] and seen.asked == []
    assert [e.reason for e in audit if e.phase == "approval"] == ["unavailable"]


@pytest.mark.anyio
async def test_no_answer_in_time_refuses() -> None:
    server, _ = build_server(approval="elicit", serving=ServingConfig(approval_timeout=0.2))

    async def never(*args: Any) -> Any:
        await asyncio.sleep(30)

    async with Client(server.fastmcp, mode="legacy", elicitation_handler=never) as client:
        result = await client.call_tool("pay", ORDER, raise_on_error=False)
    assert result.is_error and "(answer: no_answer)" in result.content[0].text
    assert CHARGED == []


ACCEPT = {APPROVAL_KEY: {"action": "accept", "content": {"approve": True}}}


@pytest.mark.anyio
async def test_input_required_round_trip_on_the_wire() -> None:
    """2026-07-28 by hand: the first round asks and has no side effect; answers without
    the server's state, or with a forged one or one bound to other arguments, never
    approve; the server's own state with an accept does."""
    server, audit = build_server(approval="elicit")
    call = {"name": "pay", "arguments": ORDER}
    async with Client(server.fastmcp, elicitation_handler=Seen().on_elicit) as client:
        first = await raw_call(client, call)
        assert first["resultType"] == "input_required" and CHARGED == []
        ask = first["inputRequests"][APPROVAL_KEY]
        assert ask["method"] == "elicitation/create"
        assert "charges a card" in ask["params"]["message"]
        state = first["requestState"]
        assert "pay" not in state  # sealed by the SDK: opaque to the client

        # Answers the server never asked for: asked again, nothing charged.
        again = await raw_call(client, {**call, "inputResponses": ACCEPT})
        assert again["resultType"] == "input_required" and CHARGED == []
        for forged in ("forged", state[:-4] + "AAAA"):
            with pytest.raises(MCPError) as caught:
                await raw_call(client, {**call, "inputResponses": ACCEPT,
                                        "requestState": forged})
            assert caught.value.error.code == -32602
        with pytest.raises(MCPError):  # bound to the arguments it was minted for
            await raw_call(client, {"name": "pay", "arguments": {**ORDER, "cents": 1},
                                    "inputResponses": ACCEPT, "requestState": state})
        assert CHARGED == []

        done = await raw_call(client, {**call, "inputResponses": ACCEPT,
                                       "requestState": state})
    assert done.get("isError") is False and CHARGED == [100]
    assert [e.reason for e in audit if e.phase == "approval"] == ["accept"]


@pytest.mark.anyio
async def test_legacy_input_required_is_never_returned() -> None:
    """2025-11-25 has no input_required: the server asks through elicitation instead."""
    server, _ = build_server(approval="elicit")
    seen = Seen({"approve": True})
    async with seen.client(server, "legacy") as client:
        result = await raw_call(client, {"name": "pay", "arguments": ORDER})
    assert result.get("resultType") != "input_required" and len(seen.asked) == 1


@pytest.mark.anyio
async def test_approval_state_is_bound_to_flow_version_steps_caller_and_arguments() -> None:
    from chainweaver.mcp.gate.admission import Admission, admitted
    from chainweaver.mcp.hooks import CallerIdentity
    from chainweaver.run_events import ApprovalRequest, CoveredStep

    class Outside:  # a call's context on no server: the process records used states
        fastmcp = None

    def hook(settings: RunSettings, arguments: dict[str, Any] = ORDER) -> Approval:
        return Approval(cast(Any, Outside()), "pay", settings, arguments=arguments)

    def covering(version: str, *steps: str) -> ApprovalRequest:
        return ApprovalRequest("pay", version, tuple(
            CoveredStep(step, "charge", "write", None, 1) for step in steps))

    settings = RunSettings(approval=True)
    approval = hook(settings)
    request = covering("1.0.0", "charge")
    state = approval._mint(request)
    assert "charge" not in state and "pay" not in state  # a digest: names nothing
    assert await approval._verify(state, request)
    assert not await approval._verify(state, covering("2.0.0", "charge"))
    assert not await approval._verify(state, covering("1.0.0", "refund"))
    assert not await approval._verify(state, covering("1.0.0", "charge", "refund"))
    assert not await hook(settings, {**ORDER, "cents": 1})._verify(state, request)
    with admitted(Admission(object(), caller=CallerIdentity("mallory"))):
        assert not await approval._verify(state, request)  # minted for another caller
    assert not await approval._verify("not|signed", request)
    stranger = hook(RunSettings(approval=True))  # another server's secret
    assert not await stranger._verify(state, request)
    # In a background task the state is the server's own (kept with the task, never
    # sent to the client), and the answered leg may run on another worker: only what
    # it is bound to is checked there.
    assert await stranger._verify(state, request, signed=False)
    assert not await stranger._verify(state, covering("2.0.0", "charge"), signed=False)
    assert not await stranger._verify("not|signed", request, signed=False)
    # A state a client echoes approves once.
    assert await approval._verify(state, request, use=True)
    assert not await approval._verify(state, request, use=True)


@pytest.mark.anyio
async def test_used_approval_states_stay_refused_however_many_are_remembered() -> None:
    import time

    nonces = ApprovalNonces(limit=3)
    later = time.time() + 60
    assert [await nonces.use(f"n{i}", later + i) for i in range(5)] == [True] * 5
    # n0 and n1 were forgotten (the record holds 3): every state expiring no later
    # than them is refused from now on, so neither can be used again.
    assert [await nonces.use(f"n{i}", later + i) for i in range(5)] == [False] * 5
    assert await nonces.use("fresh", later + 10)


@pytest.mark.anyio
async def test_a_retry_without_an_answer_or_with_a_bad_one_refuses() -> None:
    server, audit = build_server(approval="elicit")
    call = {"name": "pay", "arguments": ORDER}
    async with Client(server.fastmcp, elicitation_handler=Seen().on_elicit) as client:
        state = (await raw_call(client, call))["requestState"]
        silent = await raw_call(client, {**call, "requestState": state})
        state = (await raw_call(client, call))["requestState"]  # each state answers once
        odd = await raw_call(client, {**call, "requestState": state, "inputResponses": {
            APPROVAL_KEY: {"action": "accept", "content": {"approve": "maybe"}}}})
    assert silent["isError"] and "(answer: no_answer)" in silent["content"][0]["text"]
    assert odd["isError"] and "(answer: decline)" in odd["content"][0]["text"]
    assert CHARGED == []
    assert [e.reason for e in audit if e.phase == "approval"] == ["no_answer", "decline"]


@pytest.mark.anyio
async def test_an_elicitation_that_fails_refuses() -> None:
    server, _ = build_server(approval="elicit")

    async def fail(*args: Any) -> Any:
        raise RuntimeError("the client cannot show it")

    async with Client(server.fastmcp, mode="legacy", elicitation_handler=fail) as client:
        result = await client.call_tool("pay", ORDER, raise_on_error=False)
    assert result.is_error and "(answer: no_answer)" in result.content[0].text
    assert CHARGED == []


@pytest.mark.anyio
async def test_approval_without_gate_hooks_still_asks() -> None:
    executor = FlowExecutor(FlowRegistry())
    for t in (validate, charge):
        executor.register_tool(t)
    executor.registry.register_flow(Flow("pay", "charges", [FlowStep("validate"),
                                                            FlowStep("charge")]))
    CHARGED.clear()
    server = FlowServer(executor,
                        policy=ExposurePolicy(allowed_side_effects=["none", "read", "write"],
                                              approval="elicit"))
    seen = Seen({"approve": True})
    async with seen.client(server, "auto") as client:
        assert (await client.call_tool("pay", ORDER)).is_error is False
    assert CHARGED == [100] and len(seen.asked) == 1


@pytest.mark.anyio
async def test_run_outside_a_request_cannot_be_approved() -> None:
    server, _ = build_server(approval="elicit")
    tool_ = await server.fastmcp.get_tool("pay")
    result = await tool_.run(ORDER)
    assert result.is_error and "ApprovalDenied" in result.content[0].text
    assert CHARGED == []
    plain = await (await server.fastmcp.get_tool("checkout")).run(ORDER)
    assert plain.structured_content == {"card": SECRET, "cents": 101, "stage": 3}


def test_bad_approval_settings_are_refused() -> None:
    from chainweaver import ExposureConfigError

    with pytest.raises(ExposureConfigError, match="approval must be one of"):
        ExposurePolicy(approval="ask")  # type: ignore[arg-type]
    with pytest.raises(ExposureConfigError, match="approval_timeout"):
        build_server(approval="elicit", serving=ServingConfig(approval_timeout=0))


@pytest.mark.anyio
async def test_replicas_sharing_request_state_keys_accept_each_others_answers() -> None:
    """What stateless replicas behind a load balancer need: the question asked by one
    server, answered on another. Without shared keys the other server refuses."""
    keys = ["k" * 32, "an older key that still unseals...."]
    asking, _ = build_server(approval="elicit", state_keys=keys)
    answering, audit = build_server(approval="elicit", state_keys=keys)
    stranger, _ = build_server(approval="elicit")
    call = {"name": "pay", "arguments": ORDER}
    async with Client(asking.fastmcp, elicitation_handler=Seen().on_elicit) as client:
        state = (await raw_call(client, call))["requestState"]
    retry = {**call, "inputResponses": ACCEPT, "requestState": state}
    async with Client(stranger.fastmcp) as client:
        with pytest.raises(MCPError) as caught:
            await raw_call(client, retry)
        assert caught.value.error.code == -32602
    async with Client(answering.fastmcp) as client:
        done = await raw_call(client, retry)
    assert done.get("isError") is False and CHARGED == [100]
    assert [e.reason for e in audit if e.phase == "approval"] == ["accept"]


@pytest.mark.parametrize("keys", ["k" * 40, ["short"], [], [b"x" * 31], [42]])
def test_bad_request_state_keys_are_refused_without_echoing_them(keys: Any) -> None:
    from chainweaver import ExposureConfigError

    with pytest.raises(ExposureConfigError, match="request_state_keys") as caught:
        SecurityConfig(request_state_keys=keys)
    assert "short" not in str(caught.value) and "kkkk" not in str(caught.value)
