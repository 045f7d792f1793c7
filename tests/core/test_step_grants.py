"""Step grants in the engine: every attempt of every step is checked against the caller
as it is now, in both lanes; a refusal stops the run before the step has any effect."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel

from chainweaver import (
    Caller,
    DefinitionError,
    Delegation,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    Grants,
    RetryPolicy,
    StepDecision,
    StepRequest,
    ToolSafetyContract,
    tool,
)
from chainweaver.step_guard import MAX_KEPT_DECISIONS, Decisions, StepGuard, fixed_caller

READ = ToolSafetyContract("read")
CALLS: list[str] = []


class Record(BaseModel):
    record: str


@tool(safety=READ, requires=["records.read"])
def read_record(tenant: str) -> Record:
    CALLS.append(f"read:{tenant}")
    return Record(record=f"r-{tenant}")


@tool(safety=READ)
def summarise(record: str) -> Record:
    CALLS.append("summarise")
    return Record(record=record.upper())


@tool(safety=ToolSafetyContract("write"), requires={"scopes": ["records.admin"]})
def purge(record: str) -> Record:
    CALLS.append("purge")
    return Record(record="purged")


FLAKY: dict[str, int] = {"left": 0}


@tool(safety=READ)
def flaky(tenant: str) -> Record:
    CALLS.append("flaky")
    if FLAKY["left"] > 0:
        FLAKY["left"] -= 1
        raise ConnectionError("try again")
    return Record(record="ok")


@tool(safety=READ)
def fails(tenant: str) -> Record:
    CALLS.append("fails")
    raise RuntimeError("down")


@tool(safety=READ, requires=["records.admin"])
def strong_fallback(tenant: str) -> Record:
    CALLS.append("strong_fallback")
    return Record(record="fallback")


def executor(*flows: Flow, **options: Any) -> FlowExecutor:
    registry = FlowRegistry()
    runner = FlowExecutor(registry, **options)
    for item in (read_record, summarise, purge, flaky, fails, strong_fallback):
        runner.register_tool(item)
    for flow in flows:
        registry.register_flow(flow)
    return runner


@pytest.fixture(autouse=True)
def clean() -> None:
    CALLS.clear()
    FLAKY["left"] = 0


def run(runner: FlowExecutor, name: str, lane: str, **options: Any) -> Any:
    if lane == "sync":
        return runner.execute_flow(name, {"tenant": "a"}, **options)
    return asyncio.run(runner.execute_flow_async(name, {"tenant": "a"}, **options))


LANES = ["sync", "async"]
READER = Caller("reader", {"records.read"})
ADMIN = Caller("admin", {"records.read", "records.admin"})
NOBODY = Caller("nobody")


@pytest.mark.parametrize("lane", LANES)
def test_a_child_tool_the_caller_may_not_use_never_runs(lane: str) -> None:
    runner = executor(Flow("lookup", "d", [FlowStep("read_record"), FlowStep("summarise")]))
    result = run(runner, "lookup", lane, caller=NOBODY)
    assert not result.success and result.error.type == "StepRefused"
    assert result.error.step_id == "read_record" and result.error.detail == "missing_grant"
    assert CALLS == []
    assert [r.status for r in result.steps] == ["failed"]
    assert run(runner, "lookup", lane, caller=READER).final_output == {"record": "R-A"}


@pytest.mark.parametrize("lane", LANES)
def test_no_caller_holds_no_grant(lane: str) -> None:
    runner = executor(Flow("lookup", "d", [FlowStep("read_record")]))
    result = run(runner, "lookup", lane)
    assert result.error.type == "StepRefused" and result.error.detail == "no_caller"
    assert CALLS == []


def test_a_flow_without_grants_and_without_a_hook_has_no_guard() -> None:
    runner = executor(Flow("plain", "d", [FlowStep("summarise")], input_schema=Record))
    plan = runner.plan(runner.registry.get_flow("plain"))
    assert plan.needs == () and plan.required is None
    assert runner.step_guard(plan, READER) is None
    assert runner.execute_flow("plain", {"record": "x"}).final_output == {"record": "X"}


@pytest.mark.parametrize("lane", LANES)
def test_the_same_tool_is_allowed_on_one_resource_and_refused_on_another(lane: str) -> None:
    asked: list[StepRequest] = []

    def own_tenant(request: StepRequest) -> StepDecision:
        asked.append(request)
        tenant = request.arguments.get("tenant")
        allowed = tenant in request.caller.claims.get("tenants", ())
        return StepDecision(allowed, "other_tenant")

    runner = executor(Flow("lookup", "d", [FlowStep("read_record")]),
                      step_authorizer=own_tenant)
    caller = Caller("c", {"records.read"}, {"tenants": ["a"]})
    assert run(runner, "lookup", lane, caller=caller).success
    result = (runner.execute_flow("lookup", {"tenant": "b"}, caller=caller) if lane == "sync"
              else asyncio.run(runner.execute_flow_async("lookup", {"tenant": "b"},
                                                         caller=caller)))
    assert result.error.type == "StepRefused" and result.error.detail == "other_tenant"
    assert CALLS == ["read:a"]
    request = asked[0]
    assert (request.flow_name, request.path, request.kind, request.target) == \
        ("lookup", "read_record", "tool", "read_record")
    assert request.tool is read_record and request.safety == READ
    assert request.requires == Grants(frozenset({"records.read"}))
    with pytest.raises(TypeError):
        request.arguments["tenant"] = "x"  # type: ignore[index]


@pytest.mark.parametrize("lane", LANES)
def test_a_privileged_sub_flow_two_levels_down_is_refused_at_its_step(lane: str) -> None:
    inner = Flow("inner", "d", [FlowStep("read_record"), FlowStep("purge")])
    middle = Flow("middle", "d", [FlowStep(flow="inner", id="deep")])
    outer = Flow("outer", "d", [FlowStep("read_record"), FlowStep(flow="middle", id="mid",
                                                                   input_mapping={})],
                 input_schema=None)
    runner = executor(inner, middle, outer)
    result = run(runner, "outer", lane, caller=READER)
    assert result.error.type == "StepRefused"
    assert result.error.step_id == "mid"
    assert "mid/deep/purge" in result.error.message
    assert CALLS == ["read:a", "read:a"]  # purge never ran
    assert run(runner, "outer", lane, caller=ADMIN).success
    plan = runner.plan(outer)
    assert {need.path for need in plan.needs} == {"read_record", "mid/deep/read_record",
                                                   "mid/deep/purge"}
    assert plan.required == Grants(frozenset({"records.read", "records.admin"}))


@pytest.mark.parametrize("lane", LANES)
def test_a_fallback_stronger_than_its_step_is_refused_not_skipped(lane: str) -> None:
    flow = Flow("guarded", "d", [FlowStep("fails", on_error="fallback",
                                          fallback="strong_fallback")])
    runner = executor(flow)
    result = run(runner, "guarded", lane, caller=READER)
    assert result.error.type == "StepRefused" and result.error.detail == "missing_grant"
    assert CALLS == ["fails"]
    assert run(runner, "guarded", lane, caller=ADMIN).final_output == {"record": "fallback"}
    skip = executor(Flow("skipping", "d", [FlowStep("read_record", on_error="skip"),
                                           FlowStep("summarise", input_mapping={
                                               "record": "tenant"})]))
    refused = run(skip, "skipping", lane, caller=NOBODY)
    assert refused.error.type == "StepRefused"  # a refusal is never skipped
    assert "summarise" not in CALLS


@pytest.mark.parametrize("lane", LANES)
def test_a_retry_after_the_grant_was_revoked_mid_run_is_refused(lane: str) -> None:
    grants = {"records.read"}
    current = {"caller": Caller("c", grants)}

    @tool(safety=READ, requires=["records.read"])
    def revoking(tenant: str) -> Record:
        CALLS.append("revoking")
        current["caller"] = Caller("c")  # the grant is revoked while the step runs
        raise ConnectionError("flaky")

    registry = FlowRegistry()
    runner = FlowExecutor(registry)
    runner.register_tool(revoking)
    registry.register_flow(Flow("retrying", "d", [FlowStep(
        "revoking", retry=RetryPolicy(max_attempts=3, backoff_seconds=0))]))
    result = run(runner, "retrying", lane, caller=lambda: current["caller"])
    assert result.error.type == "StepRefused"
    assert CALLS == ["revoking"]  # the second attempt never ran
    assert result.steps[0].attempts == 1


@pytest.mark.parametrize("lane", LANES)
def test_each_retry_is_asked_with_its_attempt_number(lane: str) -> None:
    attempts: list[int] = []

    def note(request: StepRequest) -> bool:
        attempts.append(request.attempt)
        return True

    FLAKY["left"] = 2
    runner = executor(Flow("retrying", "d", [FlowStep(
        "flaky", retry=RetryPolicy(max_attempts=3, backoff_seconds=0))]),
        step_authorizer=note)
    assert run(runner, "retrying", lane, caller=NOBODY).success
    assert attempts == [1, 2, 3]


@pytest.mark.parametrize("lane", LANES)
def test_delegation_declared_runs_the_step_and_undeclared_does_not(lane: str) -> None:
    delegated = Flow("delegated", "d", [FlowStep("read_record"), FlowStep("purge")],
                     delegations=[Delegation("purge", "retention job runs as the service")])
    undeclared = Flow("undeclared", "d", [FlowStep("read_record"), FlowStep("purge")])
    seen: list[str | None] = []

    def note(request: StepRequest) -> bool:
        seen.append(request.delegated)
        return True

    runner = executor(delegated, undeclared, step_authorizer=note)
    assert run(runner, "delegated", lane, caller=READER).success
    assert seen == [None, "retention job runs as the service"]
    assert run(runner, "undeclared", lane, caller=READER).error.type == "StepRefused"
    plan = runner.plan(delegated)
    assert plan.required == Grants(frozenset({"records.read"}))
    assert [(n.path, n.delegated) for n in plan.needs] == [
        ("read_record", None), ("purge", "retention job runs as the service")]


def test_a_delegation_into_a_sub_flow_covers_its_steps_and_must_name_one() -> None:
    inner = Flow("inner", "d", [FlowStep("read_record"), FlowStep("purge")])
    outer = Flow("outer", "d", [FlowStep(flow="inner", id="sub")],
                 delegations=[Delegation("sub/purge", "cleanup")])
    runner = executor(inner, outer)
    assert runner.execute_flow("outer", {"tenant": "a"}, caller=READER).success
    wrong = Flow("wrong", "d", [FlowStep(flow="inner", id="sub")],
                 delegations=[Delegation("sub/nothing", "cleanup")])
    runner.registry.register_flow(wrong)
    assert any("UnknownDelegation" in p or "sub/nothing" in p
               for p in runner.check_flow(wrong))
    with pytest.raises(DefinitionError, match="does not have"):
        Flow("bad", "d", [FlowStep("read_record")], delegations=[Delegation("x", "y")])
    with pytest.raises(DefinitionError, match="reason"):
        Delegation("x", " ")


def test_a_delegation_covers_no_step_whose_id_merely_looks_like_a_path_under_it() -> None:
    # Delegating "read" (a tool step) must not also delegate a step with the id
    # "read/purge": that step was never named, and it needs a grant the caller lacks.
    with pytest.raises(DefinitionError, match="'/'"):
        Flow("sneaky", "d", [FlowStep("read_record", id="read"),
                             FlowStep("purge", id="read/purge")],
             delegations=[Delegation("read", "reads run on the service's grant")])
    with pytest.raises(DefinitionError, match="'/'"):
        FlowStep("purge", id="inner/purge")


@pytest.mark.parametrize("lane", LANES)
def test_a_flow_s_own_grants_are_checked_before_its_first_step(lane: str) -> None:
    runner = executor(Flow("owned", "d", [FlowStep("summarise")], input_schema=Record,
                           requires={"claims": {"team": ["ops"]}}))
    result = (runner.execute_flow("owned", {"record": "x"}, caller=READER) if lane == "sync"
              else asyncio.run(runner.execute_flow_async("owned", {"record": "x"},
                                                         caller=READER)))
    assert result.error.type == "StepRefused" and result.steps == []
    ops = Caller("o", claims={"team": "ops dev"})
    assert runner.execute_flow("owned", {"record": "x"}, caller=ops).success


@pytest.mark.parametrize("lane", LANES)
def test_a_hook_that_raises_or_answers_vaguely_refuses(lane: str) -> None:
    def broken(request: StepRequest) -> bool:
        raise RuntimeError("policy store down")

    runner = executor(Flow("lookup", "d", [FlowStep("read_record")]),
                      step_authorizer=broken)
    result = run(runner, "lookup", lane, caller=ADMIN)
    assert result.error.detail == "step_authorizer_error" and CALLS == []
    vague = executor(Flow("lookup", "d", [FlowStep("read_record")]),
                     step_authorizer=lambda request: "yes")
    assert run(vague, "lookup", lane, caller=ADMIN).error.detail == "forbidden"


@pytest.mark.parametrize("lane", LANES)
def test_an_async_hook_is_awaited_and_cannot_widen_declared_grants(lane: str) -> None:
    async def allow_all(request: StepRequest) -> bool:
        await asyncio.sleep(0)
        return True

    runner = executor(Flow("lookup", "d", [FlowStep("read_record")]),
                      step_authorizer=allow_all)
    assert run(runner, "lookup", lane, caller=READER).success
    assert run(runner, "lookup", lane, caller=NOBODY).error.detail == "missing_grant"


def test_decisions_are_kept_bounded_and_counted() -> None:
    decisions = Decisions()
    for index in range(MAX_KEPT_DECISIONS + 10):
        decisions.add(f"s{index}", "tool", "t", index % 2 == 0, "ok", None)
    summary = decisions.summary()
    assert len(summary["steps"]) == MAX_KEPT_DECISIONS
    assert summary["omitted"] == 10
    assert summary["allowed"] + summary["denied"] == MAX_KEPT_DECISIONS + 10
    assert summary["refused"] == summary["steps"][1]  # the first refusal, in full


def test_a_guard_collects_each_decision_of_a_run() -> None:
    runner = executor(Flow("lookup", "d", [FlowStep("read_record"), FlowStep("summarise")]))
    plan = runner.plan(runner.registry.get_flow("lookup"))
    guard = StepGuard(fixed_caller(READER), None, "lookup", "1.0.0")
    assert runner.execute_flow("lookup", {"tenant": "a"}, guard=guard).success
    assert [(d["path"], d["decision"]) for d in guard.decisions.summary()["steps"]] == [
        ("read_record", "allowed"), ("summarise", "allowed")]
    assert plan.needs


def test_grants_declarations_are_checked() -> None:
    assert Grants.of(None) is None and Grants.of([]) is None
    assert Grants.of({"claims": {"tenant": "a"}}) == Grants(claims={"tenant": ["a"]})
    for wrong in ("scope", {"scope": ["x"]}, {"claims": {"t": []}}, [1]):
        with pytest.raises(DefinitionError):
            Grants.of(wrong)
    with pytest.raises(TypeError):
        StepDecision(False, "has spaces")
    combined = Grants(frozenset({"a"}), {"t": ["x", "y"]}).union(
        Grants(frozenset({"b"}), {"t": ["y"]}))
    assert combined.held_by(Caller("c", {"a", "b"}, {"t": ["y"]}))
    assert not combined.held_by(Caller("c", {"a", "b"}, {"t": "x"}))


@pytest.mark.parametrize("lane", LANES)
def test_a_sub_flow_with_a_timeout_runs_its_steps_under_the_same_guard(lane: str) -> None:
    inner = Flow("inner", "d", [FlowStep("read_record"), FlowStep("purge")])
    outer = Flow("outer", "d", [FlowStep(flow="inner", id="timed", timeout=30)])
    runner = executor(inner, outer)
    result = run(runner, "outer", lane, caller=READER)
    assert result.error.type == "StepRefused" and "timed/purge" in result.error.message
    assert CALLS == ["read:a"]
    assert run(runner, "outer", lane, caller=ADMIN).success


@tool(safety=READ, requires=["records.read"], blocking=False)
def quick_read(tenant: str) -> Record:
    CALLS.append(f"quick:{tenant}")
    return Record(record=f"r-{tenant}")


@pytest.mark.parametrize("first", ["read_record", "quick_read"])
@pytest.mark.parametrize("timeout", [None, 30])
def test_async_hooks_of_an_async_run_are_awaited_on_its_loop(timeout: float | None,
                                                             first: str) -> None:
    # read_record is a sync tool: the async lane runs it in a worker thread, and the
    # check before it was answered there, the async hooks on a private event loop;
    # quick_read runs on the loop itself (non-blocking), where a check cannot wait
    # for the loop.
    loops: list[bool] = []

    async def main() -> Any:
        loop = asyncio.get_running_loop()

        async def now() -> Caller:
            loops.append(asyncio.get_running_loop() is loop)
            return READER

        async def on_this_loop(request: StepRequest) -> bool:
            loops.append(asyncio.get_running_loop() is loop)
            return True

        inner = Flow("inner", "d", [FlowStep(first), FlowStep("summarise")])
        outer = Flow("outer", "d", [FlowStep(flow="inner", id="sub", timeout=timeout)])
        runner = executor(inner, outer, step_authorizer=on_this_loop)
        runner.register_tool(quick_read)
        return await runner.execute_flow_async("outer", {"tenant": "a"}, caller=now)

    assert asyncio.run(main()).success
    assert loops == [True] * 6  # the sub-flow step, then each of its two steps


@pytest.mark.parametrize("lane", LANES)
def test_a_caller_source_that_raises_refuses_and_the_log_says_why(
        lane: str, caplog: pytest.LogCaptureFixture) -> None:
    def directory_down() -> Caller:
        raise ConnectionError("directory unreachable")

    runner = executor(Flow("lookup", "d", [FlowStep("read_record")]))
    with caplog.at_level("WARNING", logger="chainweaver.grants"):
        result = run(runner, "lookup", lane, caller=directory_down)
    assert result.error.type == "StepRefused" and result.error.detail == "no_caller"
    assert CALLS == []
    assert "ConnectionError" in caplog.text and "step refused" in caplog.text


class AppUser:
    """A caller of the application's own making: scopes in a list, or one string."""

    def __init__(self, scopes: Any, claims: Any = None) -> None:
        self.id = "app-user"
        self.scopes = scopes
        self.claims = claims


@pytest.mark.parametrize("lane", LANES)
def test_any_caller_with_scopes_and_claims_is_checked_as_it_says(lane: str) -> None:
    # "Anything with scopes and claims": a list of scopes was refused with
    # step_authorizer_error, and a flow's own grants raised TypeError out of the run.
    runner = executor(Flow("lookup", "d", [FlowStep("read_record")],
                           requires={"claims": {"team": ["ops"]}}))
    for scopes in (["records.read"], ("records.read",), "records.read other.scope"):
        result = run(runner, "lookup", lane, caller=AppUser(scopes, {"team": "ops"}))
        assert result.success, (scopes, result.error)
    for caller in (AppUser(["other"], {"team": "ops"}), AppUser(["records.read"], None),
                   AppUser(None, {"team": "ops"}), AppUser(["records.read"], ["team"])):
        result = run(runner, "lookup", lane, caller=caller)
        assert result.error.type == "StepRefused" and result.error.detail == "missing_grant"
    assert CALLS == ["read:a"] * 3


def _branch(index: int) -> Any:
    def branch(tenant: str) -> dict:
        time.sleep(0.001)  # a sync tool: each branch checks from a worker thread
        return {f"branch_{index}": tenant}

    branch.__name__ = f"branch_{index}"
    return tool(safety=READ, requires=["records.read"])(branch)


def test_parallel_branches_ask_their_async_hooks_at_once() -> None:
    # Six branches of sync tools start together, each checked from its own worker
    # thread, each awaiting the async hook on the run's loop: all at once, and never
    # refused for it (the run's context could not be entered twice at a time).
    class Out(BaseModel):
        branch_0: str

    async def allow(request: StepRequest) -> bool:
        await asyncio.sleep(0)
        return True

    runner = executor(step_authorizer=allow)
    for index in range(6):
        runner.register_tool(_branch(index))
    runner.registry.register_flow(Flow("wide", "d", [
        FlowStep(f"branch_{index}", after=[]) for index in range(6)], output_schema=Out))

    async def main() -> list[Any]:
        return [await runner.execute_flow_async("wide", {"tenant": "a"}, caller=READER)
                for _ in range(20)]

    assert [result.error for result in asyncio.run(main())] == [None] * 20
