"""DAG flows: ids and after, conditions, retries, timeouts, on_error, fallbacks, sub-flows."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest
from pydantic import BaseModel

from chainweaver import (
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)

READ = ToolSafetyContract("read")
WRITE = ToolSafetyContract("write")
CALLS: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


class Order(BaseModel):
    order_id: str
    total: int


class Stock(BaseModel):
    in_stock: bool


class Shipping(BaseModel):
    days: int


class Offer(BaseModel):
    order_id: str
    total: int
    in_stock: bool
    days: int


class OfferText(BaseModel):
    text: str


@tool(safety=READ)
def load_order(order_id: str) -> Order:
    CALLS["load_order"] += 1
    return Order(order_id=order_id, total=120 if order_id != "small" else 5)


@tool(safety=READ)
async def check_stock(order_id: str) -> Stock:
    CALLS["check_stock"] += 1
    await asyncio.sleep(0)
    return Stock(in_stock=order_id != "none")


@tool(safety=READ)
def quote_shipping(total: int) -> Shipping:
    CALLS["quote_shipping"] += 1
    return Shipping(days=2 if total > 100 else 5)


@tool(safety=READ)
def offer(order_id: str, total: int, in_stock: bool, days: int) -> OfferText:
    CALLS["offer"] += 1
    return OfferText(text=f"{order_id}: {total} in {days} days, in stock: {in_stock}")


def build(*tools, flows=()) -> tuple[FlowRegistry, FlowExecutor]:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for t in tools or (load_order, check_stock, quote_shipping, offer):
        executor.register_tool(t)
    for flow in flows:
        registry.register_flow(flow)
    return registry, executor


DIAMOND = Flow("diamond", "Order, then stock and shipping at once, then an offer.", [
    FlowStep("load_order"),
    FlowStep("check_stock", after=["load_order"]),
    FlowStep("quote_shipping", after=["load_order"]),
    FlowStep("offer", after=["check_stock", "quote_shipping"]),
])


def both_lanes(executor: FlowExecutor, name: str, data: dict):
    sync = executor.execute_flow(name, data)
    async_ = asyncio.run(executor.execute_flow_async(name, data))
    return sync, async_


def shape(result) -> list[tuple]:
    """Records without timings (a sub-flow's too): what both lanes must agree on."""
    return [(r.step_id, r.status, r.inputs, r.outputs, r.error, r.attempts, r.fallback,
             r.steps and shape(r)) for r in result.steps]


# ------------------------------------------------------------------ graph definition


def test_default_after_keeps_lists_linear_and_ids_default_to_tool_names() -> None:
    flow = Flow("f", "", [FlowStep("a"), FlowStep("b"), FlowStep("c")])
    assert flow.step_ids == ("a", "b", "c")
    assert flow.dependencies == ((), (0,), (1,))
    assert flow.order == (0, 1, 2) and flow.sink == 2


def test_order_is_topological_with_ties_by_declaration() -> None:
    flow = Flow("f", "", [
        FlowStep("join", after=["x", "y"]),
        FlowStep("y", after=()),
        FlowStep("x", after=()),
    ])
    assert [flow.step_ids[i] for i in flow.order] == ["y", "x", "join"]


@pytest.mark.parametrize(("steps", "message"), [
    ([FlowStep("a"), FlowStep("a")], "give each an id"),
    ([FlowStep("a", id="s"), FlowStep("b", id="s")], "same id 's'"),
    ([FlowStep("a"), FlowStep("b", after=["nope"])], "unknown step id 'nope'"),
    ([FlowStep("a", after=["b"]), FlowStep("b")], "cycle"),
    ([FlowStep("a", after=["a"])], "after itself"),
    ([FlowStep("a"), FlowStep("b", after=())], "give the flow an output_schema"),
    ([FlowStep("a", output_mapping={"k": "x"}), FlowStep("b", after=()),
      FlowStep("c", after=(), output_mapping={"k": "y"}),
      FlowStep("d", after=["a", "b", "c"])], "'a' and 'c' may run at the same time"),
])
def test_graph_definition_errors(steps, message) -> None:
    with pytest.raises(DefinitionError, match=message):
        Flow("f", "", steps)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"on_error": "ignore"}, "on_error"),
    ({"on_error": "fallback"}, "go together"),
    ({"fallback": "other"}, "go together"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": -1}, "timeout"),
    ({"retry": 3}, "RetryPolicy"),
    ({"after": "a"}, "not the string"),
    ({"when": "len(x) > 1"}, "not allowed"),
    ({"when": "x >"}, "not valid"),
    ({"output_mapping": {"a": 1}}, "strings"),
])
def test_step_definition_errors(kwargs, message) -> None:
    with pytest.raises(DefinitionError, match=message):
        FlowStep("t", **kwargs)


def test_a_step_is_a_tool_or_a_flow() -> None:
    assert FlowStep(flow="sub").name == "sub"
    with pytest.raises(DefinitionError, match="exactly one"):
        FlowStep("t", flow="sub")
    with pytest.raises(DefinitionError, match="exactly one"):
        FlowStep()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_attempts": 0}, "max_attempts"),
    ({"backoff_seconds": -1}, "backoff_seconds"),
    ({"jitter": 2}, "jitter"),
    ({"retry_on": [3]}, "retry_on"),
    ({"retry_on": []}, "at least one"),
])
def test_retry_policy_checks(kwargs, message) -> None:
    with pytest.raises(DefinitionError, match=message):
        RetryPolicy(**kwargs)
    policy = RetryPolicy(retry_on=[ConnectionError, "TimeoutError"])
    assert policy.retry_on == ("ConnectionError", "TimeoutError")
    assert policy.retries(ConnectionResetError()) and not policy.retries(ValueError())
    assert RetryPolicy(backoff_seconds=1, max_backoff_seconds=3).delay(5) == 3


# ------------------------------------------------------------------ running


def test_diamond_runs_in_both_lanes_with_the_same_records() -> None:
    _, executor = build(flows=[DIAMOND])
    sync, async_ = both_lanes(executor, "diamond", {"order_id": "A"})
    assert sync.success and async_.success
    assert sync.final_output == async_.final_output == {
        "text": "A: 120 in 2 days, in stock: True"}
    assert shape(sync) == shape(async_)
    assert [r.step_id for r in sync.steps] == ["load_order", "check_stock", "quote_shipping",
                                               "offer"]
    assert all(r.status == "completed" and r.attempts == 1 for r in sync.steps)


def test_fan_out_runs_branches_concurrently() -> None:
    started: list[str] = []
    gate = asyncio.Event()

    def branch(name: str):
        @tool(name=name)
        async def wait(x: int) -> dict:
            started.append(name)
            if len(started) == 3:
                gate.set()
            await gate.wait()  # only returns once every branch has started
            return {name: x}
        return wait

    @tool
    def join(a: int, b: int, c: int) -> dict:
        return {"sum": a + b + c}

    flow = Flow("fan", "", [FlowStep("a", after=()), FlowStep("b", after=()),
                            FlowStep("c", after=()), FlowStep("join", after=["a", "b", "c"])])
    _, executor = build(branch("a"), branch("b"), branch("c"), join, flows=[flow])
    result = asyncio.run(executor.execute_flow_async("fan", {"x": 2}, timeout=30))
    assert result.success, result.error
    assert result.final_output == {"sum": 6}


def test_a_step_sees_only_its_ancestors_outputs() -> None:
    @tool
    def left(x: int) -> dict:
        return {"seen": "left"}

    @tool
    def right(seen: str = "nothing") -> dict:
        return {"right_saw": seen}

    class Out(BaseModel):
        right_saw: str

    flow = Flow("f", "", [FlowStep("left", after=()), FlowStep("right", after=())],
                output_schema=Out)
    _, executor = build(left, right, flows=[flow])
    for result in both_lanes(executor, "f", {"x": 1}):
        # left is not an ancestor of right: it never sees left's output, whatever the timing
        assert result.final_output == {"right_saw": "nothing"}


def test_conditions_skip_steps_and_skipped_outputs_are_absent() -> None:
    @tool(safety=READ)
    def approve(total: int) -> dict:
        return {"approved": True}

    @tool(safety=READ)
    def finish(order_id: str, approved: bool = False) -> dict:
        return {"done": f"{order_id} approved={approved}"}

    flow = Flow("f", "", [
        FlowStep("load_order"),
        FlowStep("approve", when="total > 100 and order_id not in ['X', 'Y']"),
        FlowStep("finish"),
    ])
    _, executor = build(load_order, approve, finish, flows=[flow])
    big_sync, big_async = both_lanes(executor, "f", {"order_id": "A"})
    small_sync, small_async = both_lanes(executor, "f", {"order_id": "small"})
    assert big_sync.final_output == {"done": "A approved=True"}
    assert small_sync.final_output == {"done": "small approved=False"}
    assert [r.status for r in small_sync.steps] == ["completed", "skipped", "completed"]
    assert small_sync.steps[1].inputs is None and small_sync.steps[1].attempts == 0
    assert shape(big_sync) == shape(big_async) and shape(small_sync) == shape(small_async)


def test_a_required_field_only_a_skipped_step_provides_fails_naming_step_and_field() -> None:
    @tool(safety=READ)
    def approve(total: int) -> dict:
        return {"approved": True}

    @tool(safety=READ)
    def finish(approved: bool) -> dict:
        return {"done": approved}

    flow = Flow("f", "", [FlowStep("load_order"), FlowStep("approve", when="total > 1000"),
                          FlowStep("finish")])
    _, executor = build(load_order, approve, finish, flows=[flow])
    assert executor.check_flow(flow) == []  # "maybe" provided: not a static problem
    for result in both_lanes(executor, "f", {"order_id": "A"}):
        assert (result.error.type, result.error.step_id, result.error.field) == (
            "MissingContextKeyError", "finish", "approved")
        assert "'approve'" in result.error.message and "skipped" in result.error.message


def test_a_condition_that_cannot_be_decided_fails_the_step() -> None:
    flow = Flow("f", "", [FlowStep("load_order"), FlowStep("quote_shipping",
                                                           when="missing > 3")])
    _, executor = build(flows=[flow])
    result = executor.execute_flow("f", {"order_id": "A"})
    assert (result.error.type, result.error.step_id) == ("ConditionError", "quote_shipping")


def test_a_skipped_last_step_leaves_no_output() -> None:
    flow = Flow("f", "", [FlowStep("load_order"), FlowStep("quote_shipping", when="False")])
    _, executor = build(flows=[flow])
    result = executor.execute_flow("f", {"order_id": "A"})
    assert (result.error.type, result.error.step_id) == ("OutputValidationError",
                                                         "quote_shipping")


def _flaky(name: str, failures: int, safety=READ, error=ConnectionError):
    @tool(name=name, safety=safety)
    def flaky(x: int) -> dict:
        CALLS[name] += 1
        if CALLS[name] <= failures:
            raise error(f"try {CALLS[name]}")
        return {"y": x}
    return flaky


def test_retries_record_every_attempt() -> None:
    flaky = _flaky("flaky", 2)
    flow = Flow("f", "", [FlowStep("flaky", retry=RetryPolicy(3, backoff_seconds=0))])
    _, executor = build(flaky, flows=[flow])
    result = executor.execute_flow("f", {"x": 1})
    assert result.success and result.final_output == {"y": 1}
    [record] = result.steps
    assert record.attempts == 3 and record.status == "completed"
    assert [e.type for e in record.attempt_errors] == ["ConnectionError"] * 2
    CALLS.clear()
    async_ = asyncio.run(executor.execute_flow_async("f", {"x": 1}))
    assert shape(async_) == shape(result)


def test_retries_stop_at_max_attempts_and_only_for_retry_on() -> None:
    flow = Flow("f", "", [FlowStep("flaky", retry=RetryPolicy(2, backoff_seconds=0))])
    _, executor = build(_flaky("flaky", 5), flows=[flow])
    result = executor.execute_flow("f", {"x": 1})
    assert result.error.type == "ConnectionError" and result.steps[0].attempts == 2
    assert result.steps[0].status == "failed"

    only = Flow("g", "", [FlowStep("other", retry=RetryPolicy(
        3, backoff_seconds=0, retry_on=["TimeoutError"]))])
    _, executor = build(_flaky("other", 5, error=ValueError), flows=[only])
    assert executor.execute_flow("g", {"x": 1}).steps[0].attempts == 1


def test_retry_on_a_non_idempotent_step_is_rejected() -> None:
    charge = _flaky("charge", 0, safety=WRITE)
    flow = Flow("f", "", [FlowStep("charge", retry=RetryPolicy())])
    _, executor = build(charge, flows=[flow])
    [problem] = executor.check_flow(flow)
    assert "retry" in problem and "not idempotent" in problem
    result = executor.execute_flow("f", {"x": 1})
    assert result.error.type == "RetryNotAllowedError" and result.error.step_id == "charge"
    assert CALLS["charge"] == 0  # nothing ran


def test_on_error_skip_records_the_error_and_goes_on() -> None:
    @tool(safety=READ)
    def enrich(x: int) -> dict:
        raise RuntimeError("enrichment service down")

    @tool(safety=READ)
    def answer(x: int, extra: str = "none") -> dict:
        return {"answer": f"{x}/{extra}"}

    flow = Flow("f", "", [FlowStep("enrich", on_error="skip"), FlowStep("answer")])
    _, executor = build(enrich, answer, flows=[flow])
    sync, async_ = both_lanes(executor, "f", {"x": 1})
    assert sync.success and sync.final_output == {"answer": "1/none"}
    assert sync.steps[0].status == "skipped" and sync.steps[0].error.type == "RuntimeError"
    assert shape(sync) == shape(async_)


def test_fallback_runs_on_the_same_input() -> None:
    broken = _flaky("primary", 99)

    @tool(safety=READ)
    def backup(x: int) -> dict:
        return {"y": -x}

    flow = Flow("f", "", [FlowStep("primary", on_error="fallback", fallback="backup")])
    _, executor = build(broken, backup, flows=[flow])
    sync, async_ = both_lanes(executor, "f", {"x": 4})
    assert sync.final_output == {"y": -4}
    [record] = sync.steps
    assert (record.status, record.fallback, record.attempts) == ("completed", "backup", 2)
    assert record.attempt_errors[0].type == "ConnectionError" and record.error is None
    assert shape(sync) == shape(async_)


def test_a_failing_fallback_fails_the_step() -> None:
    @tool(safety=READ)
    def backup(x: int) -> dict:
        raise ValueError("backup down too")

    flow = Flow("f", "", [FlowStep("primary", on_error="fallback", fallback="backup")])
    _, executor = build(_flaky("primary", 99), backup, flows=[flow])
    result = executor.execute_flow("f", {"x": 4})
    assert result.error.type == "ValueError" and result.error.tool_name == "backup"
    assert result.steps[0].status == "failed"


def test_per_attempt_timeout_in_both_lanes() -> None:
    release = threading.Event()

    @tool(safety=READ)
    def stuck_sync(x: int) -> dict:
        release.wait(10)
        return {"y": x}

    @tool(safety=READ)
    async def stuck_async(x: int) -> dict:
        await asyncio.Event().wait()
        return {"y": x}

    flows = [Flow("s", "", [FlowStep("stuck_sync", timeout=0.05)]),
             Flow("a", "", [FlowStep("stuck_async", timeout=0.05, on_error="skip"),
                            FlowStep("stuck_sync", id="after", timeout=5, when="False")],
                  output_schema=Shipping)]
    _, executor = build(stuck_sync, stuck_async, flows=flows)
    try:
        for result in both_lanes(executor, "s", {"x": 1}):
            assert result.error.type == "TimeoutError" and result.error.step_id == "stuck_sync"
            assert "within 0.05 s" in result.error.message
        for result in both_lanes(executor, "a", {"x": 1}):
            assert result.steps[0].status == "skipped"
            assert result.steps[0].error.type == "TimeoutError"
    finally:
        release.set()


class Price(BaseModel):
    cents: int


class Skus(BaseModel):
    first: str
    second: str


class BothPrices(BaseModel):
    first_cents: int
    second_cents: int


@tool(safety=READ)
def price(sku: str) -> Price:
    return Price(cents=len(sku) * 100)


def test_output_mapping_renames_and_lets_parallel_branches_share_a_tool() -> None:
    flow = Flow("f", "", [
        FlowStep("price", {"sku": "first"}, id="p1", after=(),
                 output_mapping={"first_cents": "cents"}),
        FlowStep("price", {"sku": "second"}, id="p2", after=(),
                 output_mapping={"second_cents": "cents"}),
    ], input_schema=Skus, output_schema=BothPrices)
    _, executor = build(price, flows=[flow])
    assert executor.check_flow(flow) == []
    for result in both_lanes(executor, "f", {"first": "ab", "second": "abc"}):
        assert result.final_output == {"first_cents": 200, "second_cents": 300}
        assert result.steps[0].outputs == {"cents": 200}  # the record keeps the tool's output
    wrong = Flow("g", "", [FlowStep("price", {"sku": "first"}, output_mapping={"c": "euros"})],
                 input_schema=Skus)
    assert executor.check_flow(wrong) == [
        "step 0 ('price') maps output field 'euros' (to context key 'c'), which its output "
        "does not have"]


def test_parallel_steps_writing_the_same_key_are_a_definition_error() -> None:
    clash = Flow("g", "", [FlowStep("load_order", id="load_order", after=()),
                           FlowStep("load_order", id="twin", after=())], output_schema=Order)
    _, executor = build(flows=[clash])
    [problem] = executor.check_flow(clash)
    assert "'load_order' and 'twin' may run at the same time" in problem
    result = executor.execute_flow("g", {"order_id": "A"})
    assert result.error.type == "ConflictingWritesError" and result.steps == []


def test_a_sub_flow_runs_as_one_step() -> None:
    inner = Flow("stock_and_shipping", "", [
        FlowStep("load_order"), FlowStep("check_stock", after=["load_order"]),
        FlowStep("quote_shipping", after=["load_order"]),
    ], output_schema=type("Inner", (BaseModel,), {"__annotations__": {
        "total": int, "in_stock": bool, "days": int}}))
    outer = Flow("outer", "", [FlowStep(flow="stock_and_shipping"), FlowStep("offer")],
                 input_schema=type("OuterIn", (BaseModel,), {"__annotations__": {
                     "order_id": str}}))
    _, executor = build(flows=[inner, outer])
    assert executor.check_flow(outer) == []
    assert executor.effective_safety(outer) == ToolSafetyContract(SideEffectLevel.READ)
    sync, async_ = both_lanes(executor, "outer", {"order_id": "B"})
    assert sync.final_output == {"text": "B: 120 in 2 days, in stock: True"}
    assert shape(sync) == shape(async_)
    assert sync.steps[0].step_id == "stock_and_shipping"
    assert sync.steps[0].outputs == {"total": 120, "in_stock": True, "days": 2}
    assert [r.step_id for r in sync.steps[0].steps] == ["load_order", "check_stock",
                                                        "quote_shipping"]
    assert shape(async_.steps[0]) == shape(sync.steps[0])


def test_missing_and_recursive_sub_flows_make_the_parent_invalid() -> None:
    a = Flow("a", "", [FlowStep(flow="b")])
    b = Flow("b", "", [FlowStep(flow="a")])
    lonely = Flow("lonely", "", [FlowStep(flow="ghost")])
    _, executor = build(flows=[a, b, lonely])
    assert "recursively" in executor.check_flow(a)[0]
    assert executor.effective_safety(a) is None
    assert executor.check_flow(lonely) == ["step 0 ('ghost') uses unregistered flow 'ghost'"]
    result = executor.execute_flow("lonely", {})
    assert result.error.type == "FlowNotFoundError" and result.error.step_id == "ghost"


def test_plans_are_compiled_once_per_flow_version() -> None:
    _, executor = build(flows=[DIAMOND])
    for _ in range(3):
        executor.execute_flow("diamond", {"order_id": "A"})
        asyncio.run(executor.execute_flow_async("diamond", {"order_id": "A"}))
    assert executor.plans_compiled == 1


def test_a_failing_branch_fails_the_run_in_both_lanes() -> None:
    @tool(safety=READ)
    def broken(order_id: str) -> Shipping:
        raise RuntimeError("no")

    flow = Flow("f", "", [FlowStep("load_order"),
                          FlowStep("broken", after=["load_order"]),
                          FlowStep("check_stock", after=["load_order"]),
                          FlowStep("offer", after=["broken", "check_stock"])])
    _, executor = build(load_order, broken, check_stock, offer, flows=[flow])
    for result in both_lanes(executor, "f", {"order_id": "A"}):
        assert (result.error.type, result.error.step_id) == ("RuntimeError", "broken")
        assert "offer" not in [r.step_id for r in result.steps]


def test_a_new_sub_flow_version_at_any_depth_is_seen_by_its_parents() -> None:
    registry, executor = build(flows=[
        Flow("leaf", "", [FlowStep("load_order")]),
        Flow("middle", "", [FlowStep(flow="leaf")]),
        Flow("top", "", [FlowStep(flow="middle")]),
    ])
    assert executor.check_flow(registry.get_flow("top")) == []
    assert executor.execute_flow("top", {"order_id": "A"}).success
    registry.register_flow(Flow("leaf", "", [FlowStep("ghost_tool")], version="2.0.0"))
    [problem] = executor.check_flow(registry.get_flow("top"))
    assert "sub-flow 'middle' is invalid" in problem and "'ghost_tool'" in problem
    result = executor.execute_flow("top", {"order_id": "A"})
    assert result.error.type == "InvalidSubFlowError" and result.error.step_id == "middle"
