"""The ``when`` language on list values; definition errors for wrong argument types."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from chainweaver import (
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    ToolSafetyContract,
    tool,
)
from chainweaver.cli.mermaid import mermaid
from chainweaver.conditions import Condition


@pytest.mark.parametrize(("text", "context", "expected"), [
    ("tags == []", {"tags": []}, True),
    ("tags != []", {"tags": []}, False),
    ("tags == ['urgent']", {"tags": ["urgent"]}, True),
    ("tags == ['urgent']", {"tags": ("urgent",)}, True),
    ("pair == (1, 2)", {"pair": [1, 2]}, True),
    ("tags == [['a']]", {"tags": [("a",)]}, True),
    ("tags != ['a']", {"tags": ["b"]}, True),
    ("'a' in ['a', 'b']", {}, True),
])
def test_list_literals_compare_with_list_values(text, context, expected) -> None:
    assert Condition(text).evaluate(context) is expected


class Tags(BaseModel):
    tags: list[str]


@tool
def start(tags: list[str]) -> dict:
    return {"n": len(tags)}


@tool
def notify(tags: list[str]) -> dict:
    return {"sent": True}


def test_a_step_skips_on_an_empty_list() -> None:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(start)
    executor.register_tool(notify)
    registry.register_flow(Flow("f", "", [FlowStep("start"),
                                          FlowStep("notify", when="tags != []")],
                                input_schema=Tags, output_schema=Tags))
    assert [r.status for r in executor.execute_flow("f", {"tags": []}).steps] == \
        ["completed", "skipped"]
    assert [r.status for r in executor.execute_flow("f", {"tags": ["x"]}).steps] == \
        ["completed", "completed"]


# ------------------------------------------------------------------ definitions


@pytest.mark.parametrize(("build", "message"), [
    (lambda: FlowStep("a", input_mapping=None), "input_mapping must be a mapping"),
    (lambda: FlowStep("a", input_mapping=["x"]), "input_mapping must be a mapping"),
    (lambda: FlowStep("a", output_mapping=5), "output_mapping must be a mapping"),
    (lambda: FlowStep("a", after=5), "after must be a list of step ids"),
    (lambda: FlowStep("a", after={"x": "y"}), "after must be a list of step ids"),
    (lambda: RetryPolicy(retry_on=None), "retry_on must be a list"),
    (lambda: RetryPolicy(retry_on=5), "retry_on must be a list"),
    (lambda: Flow("f", "d", None), "steps must be a list of FlowStep values"),
    (lambda: Flow("f", "d", 5), "steps must be a list of FlowStep values"),
    (lambda: RetryPolicy(max_attempts=101), "max_attempts must be an integer from 1 to 100"),
    (lambda: RetryPolicy(backoff_seconds=1e300), "backoff_seconds must be a number"),
    (lambda: RetryPolicy(max_backoff_seconds=float("inf")), "max_backoff_seconds must be"),
    (lambda: RetryPolicy(backoff_seconds=float("nan")), "backoff_seconds must be"),
    (lambda: RetryPolicy(max_backoff_seconds=3601), "from 0 to 3600"),
    # The event loop's clock cannot add 1e300 seconds: refused here, not mid-run.
    (lambda: FlowStep("a", timeout=1e300), "timeout must be .* at most 2592000"),
    (lambda: FlowStep("a", timeout=30 * 86400 + 1), "at most 2592000"),
])
def test_wrong_argument_types_and_values_are_definition_errors(build, message) -> None:
    with pytest.raises(DefinitionError, match=message):
        build()


def test_the_largest_allowed_step_timeout_is_fine() -> None:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)

    @tool(safety=ToolSafetyContract("read"))
    def quick(x: int) -> dict:
        return {"y": x}

    executor.register_tool(quick)
    registry.register_flow(Flow("f", "", [FlowStep("quick", timeout=30 * 86400)]))
    for result in (executor.execute_flow("f", {"x": 1}),
                   asyncio.run(executor.execute_flow_async("f", {"x": 1}))):
        assert result.success and result.final_output == {"y": 1}


def test_the_largest_allowed_retry_policy_is_fine() -> None:
    policy = RetryPolicy(100, backoff_seconds=3600, max_backoff_seconds=3600, jitter=1)
    assert 0 <= policy.delay(100) <= 7200


class StrangeBackoff(RetryPolicy):
    """A policy whose delay cannot be slept: the runner must go on regardless."""

    def delay(self, attempt: int) -> float:
        if attempt == 1:
            raise OverflowError("int too large to convert to float")
        return float("nan") if attempt == 2 else -1.0


def test_a_backoff_that_cannot_be_slept_never_ends_the_run() -> None:
    @tool(safety=ToolSafetyContract("read"))
    def flaky(x: int) -> dict:
        raise ConnectionError("busy")

    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(flaky)
    registry.register_flow(Flow("f", "", [FlowStep("flaky", retry=StrangeBackoff(4))]))
    for result in (executor.execute_flow("f", {"x": 1}),
                   asyncio.run(executor.execute_flow_async("f", {"x": 1}))):
        assert result.error.type == "ConnectionError"
        assert result.steps[0].attempts == 4
        assert len(result.steps[0].attempt_errors) == 3


class Rate(BaseModel):
    rate: float


class CachedRate(BaseModel):
    cached_rate: float


@tool(safety=ToolSafetyContract("read"))
def live_rate(currency: str) -> Rate:
    raise ConnectionError("down")


@tool(safety=ToolSafetyContract("read"))
def cached_rate(currency: str) -> CachedRate:
    return CachedRate(cached_rate=1.0)


@tool(safety=ToolSafetyContract("read"))
def stale_rate(currency: str) -> Rate:
    return Rate(rate=0.9)


def _rate_executor() -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    for t in (live_rate, cached_rate, stale_rate):
        executor.register_tool(t)
    return executor


def test_a_fallback_on_the_last_step_must_return_the_flows_output_model() -> None:
    executor = _rate_executor()
    flow = Flow("rate", "", [FlowStep("live_rate", on_error="fallback",
                                      fallback="cached_rate")])
    [problem] = executor.flow_problems(flow)
    assert (problem.kind, problem.step_id, problem.fatal) == (
        "FallbackOutputError", "live_rate", False)
    assert "returns CachedRate, not Rate" in problem.message


@pytest.mark.parametrize("flow", [
    Flow("same", "", [FlowStep("live_rate", on_error="fallback", fallback="stale_rate")]),
    Flow("declared", "", [FlowStep("live_rate", on_error="fallback",
                                   fallback="cached_rate")],
         output_schema=type("Either", (BaseModel,), {"__annotations__": {
             "rate": float | None, "cached_rate": float | None},
             "rate": None, "cached_rate": None})),
    Flow("not_last", "", [FlowStep("live_rate", on_error="fallback", fallback="cached_rate"),
                          FlowStep("stale_rate")]),
])
def test_a_fallback_with_the_same_model_or_a_declared_output_is_fine(flow) -> None:
    assert _rate_executor().check_flow(flow) == []


def test_mermaid_escapes_backticks_hashes_and_line_breaks() -> None:
    graph = mermaid(Flow("f", "", [FlowStep("a", id="`odd` 1"),
                                   FlowStep("b", when="(x ==\n 1) and y != '`#'")]))
    assert "`" not in graph
    assert 'n0["#96;odd#96; 1<br/>tool: a"]' in graph
    assert "when: (x ==  1) and y != '#96;#35;'" in graph
    assert len(graph.splitlines()) == 4


@pytest.mark.parametrize("step_id", ["outer/inner", "a\x1b[31mb", "line\nbreak", "\x7f",
                                     "x#fallback"])
def test_a_step_id_holds_no_slash_no_hash_and_no_control_character(step_id: str) -> None:
    # '/' joins a sub-flow's step ids in paths (delegations, approvals, records): an id
    # holding one would read as a sub-flow's step. '#' names a fallback's key and a
    # hidden sub-flow step. Ids are shown in every report.
    with pytest.raises(DefinitionError, match=r"id must not hold '/' \(it joins the ids of "
                       r"a sub-flow's steps: 'outer/inner'\), '#' \(it names a fallback's "
                       r"key and a hidden sub-flow: 'subflow#1'\) or control characters$"):
        FlowStep("t", id=step_id)
    assert FlowStep("t", id="`odd` 1 — ünïcode ok").id == "`odd` 1 — ünïcode ok"
