"""FlowExecutor: running flows sync and async, failures, schemas, safety, checks."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import Counter

import pytest
from pydantic import BaseModel, Field, model_validator

from chainweaver import (
    ChainWeaverError,
    DuplicateToolError,
    ErrorInfo,
    ExecutionResult,
    Flow,
    FlowExecutor,
    FlowNotFoundError,
    FlowRegistry,
    FlowStep,
    FlowValidationError,
    FlowVersionNotFoundError,
    SideEffectLevel,
    StepRecord,
    Tool,
    ToolNotFoundError,
    ToolSafetyContract,
    tool,
)

CALLS: Counter[str] = Counter()


class Order(BaseModel):
    order_id: str
    status: str
    total_cents: int


class Summary(BaseModel):
    summary: str


@tool(safety=ToolSafetyContract("read"))
def fetch_order(order_id: str) -> Order:
    """Fetch an order."""
    CALLS["fetch_order"] += 1
    if order_id == "boom":
        raise RuntimeError("database is down")
    return Order(order_id=order_id, status="shipped", total_cents=1250)


@tool(safety=ToolSafetyContract("none"))
def format_price(total_cents: int, currency: str = "EUR") -> dict:
    """Format a price."""
    CALLS["format_price"] += 1
    return {"price": f"{total_cents / 100:.2f} {currency}"}


@tool(safety=ToolSafetyContract("none"), output_schema=Summary)
def summarize(order_id: str, status: str, price: str) -> dict:
    """Summarise an order."""
    CALLS["summarize"] += 1
    return {"summary": f"Order {order_id} is {status} ({price})."}


@tool
def unsafe_echo(text: str) -> dict:
    """A tool without a safety contract."""
    return {"text": text}


class FlowIn(BaseModel):
    order_id: str
    currency: str = "USD"


class FlowOut(BaseModel):
    summary: str
    status: str


def build(*tools: Tool) -> tuple[FlowRegistry, FlowExecutor]:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for t in tools or (fetch_order, format_price, summarize):
        executor.register_tool(t)
    return registry, executor


THREE_STEPS = [FlowStep("fetch_order"), FlowStep("format_price"), FlowStep("summarize")]


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


# ------------------------------------------------------------------ success


def test_three_step_flow_merges_context() -> None:
    registry, executor = build()
    registry.register_flow(Flow("order_summary", "", THREE_STEPS, version="1.2.0"))
    result = executor.execute_flow("order_summary", {"order_id": "A-1"})
    assert isinstance(result, ExecutionResult)
    assert result.success is True and result.error is None
    assert (result.flow_name, result.flow_version) == ("order_summary", "1.2.0")
    # no flow output schema: the last step's output
    assert result.final_output == {"summary": "Order A-1 is shipped (12.50 EUR)."}
    assert [s.tool_name for s in result.steps] == ["fetch_order", "format_price", "summarize"]
    assert [s.index for s in result.steps] == [0, 1, 2]
    first, second, third = result.steps
    assert first.inputs == {"order_id": "A-1"}
    assert first.outputs == {"order_id": "A-1", "status": "shipped", "total_cents": 1250}
    # format_price's unmapped field currency is absent from the context: its default is used
    assert second.inputs == {"total_cents": 1250}
    assert second.outputs == {"price": "12.50 EUR"}
    assert third.inputs == {"order_id": "A-1", "status": "shipped", "price": "12.50 EUR"}
    assert all(isinstance(s, StepRecord) and s.error is None for s in result.steps)
    assert all(s.duration_ms >= 0 for s in result.steps) and result.duration_ms >= 0


def test_flow_input_schema_seeds_the_context_and_output_schema_projects_it() -> None:
    registry, executor = build()
    registry.register_flow(Flow("s", "", THREE_STEPS, input_schema=FlowIn, output_schema=FlowOut))
    result = executor.execute_flow("s", {"order_id": "A-2"})
    assert result.success
    # currency came from the validated flow input default
    assert result.steps[1].inputs == {"total_cents": 1250, "currency": "USD"}
    assert result.final_output == {"summary": "Order A-2 is shipped (12.50 USD).",
                                   "status": "shipped"}


def test_input_mapping_renames_context_keys() -> None:
    @tool
    def add(a: int, b: int) -> dict:
        return {"total": a + b}

    registry, executor = build(add)
    registry.register_flow(Flow("sum", "", [
        FlowStep("add", {"b": "a"}, id="double_a"),             # a + a
        FlowStep("add", {"a": "total", "b": "total"}, id="double_total"),
    ]))
    result = executor.execute_flow("sum", {"a": 3, "b": 100})
    assert result.success, result.error
    assert result.steps[0].inputs == {"a": 3, "b": 3}
    assert result.final_output == {"total": 12}


def test_later_outputs_overwrite_context_keys() -> None:
    @tool
    def inc(n: int) -> dict:
        return {"n": n + 1}

    registry, executor = build(inc)
    registry.register_flow(Flow("inc3", "", [FlowStep("inc", id=f"inc{i}") for i in range(3)]))
    assert executor.execute_flow("inc3", {"n": 0}).final_output == {"n": 3}


def test_flow_input_may_be_a_model_of_any_class() -> None:
    @tool
    def echo(order_id: str, secret: str = "not in the input") -> dict:
        return {"order_id": order_id, "secret": secret}

    registry, executor = build(echo)
    registry.register_flow(Flow("s", "", [FlowStep("echo")], input_schema=FlowIn))

    class Other(BaseModel):
        order_id: str

    class Extended(FlowIn):
        secret: str = "undeclared"

    for given in (FlowIn(order_id="A"), Other(order_id="A"), Extended(order_id="A")):
        result = executor.execute_flow("s", given)
        assert result.success
        # fields the flow's input model does not declare never reach the context
        assert result.steps[0].inputs == {"order_id": "A"}
        assert result.final_output == {"order_id": "A", "secret": "not in the input"}


def test_tool_may_return_a_model_of_another_class_with_the_right_fields() -> None:
    class Shape(BaseModel):
        order_id: str
        status: str
        total_cents: int

    class Extended(Order):
        internal_note: str = "do not leak"

    @tool(name="fetch_order")
    def fetch_other(order_id: str) -> Order:
        return Shape(order_id=order_id, status="new", total_cents=1)  # type: ignore[return-value]

    @tool(name="fetch_order")
    def fetch_subclass(order_id: str) -> Order:
        return Extended(order_id=order_id, status="new", total_cents=1)

    for fetch in (fetch_other, fetch_subclass):
        registry, executor = build(fetch)
        registry.register_flow(Flow("f", "", [FlowStep("fetch_order")]))
        result = executor.execute_flow("f", {"order_id": "A"})
        assert result.success, result.error
        # only the declared output fields reach the context and the result
        assert result.final_output == {"order_id": "A", "status": "new", "total_cents": 1}


def test_tool_without_output_schema_may_return_a_model_or_mapping() -> None:
    from types import MappingProxyType

    @tool
    def as_model(x: int):
        return Summary(summary=str(x))

    @tool
    def as_mapping(summary: str):
        return MappingProxyType({"y": summary + "!"})

    registry, executor = build(as_model, as_mapping)
    registry.register_flow(Flow("f", "", [FlowStep("as_model"), FlowStep("as_mapping")]))
    result = executor.execute_flow("f", {"x": 5})
    assert result.steps[0].outputs == {"summary": "5"}
    assert result.final_output == {"y": "5!"}
    assert type(result.final_output) is dict


def test_specific_version_runs() -> None:
    @tool
    def v1(x: int) -> dict:
        return {"v": 1}

    @tool
    def v2(x: int) -> dict:
        return {"v": 2}

    registry, executor = build(v1, v2)
    registry.register_flow(Flow("f", "", [FlowStep("v1")], version="1.9.0"))
    registry.register_flow(Flow("f", "", [FlowStep("v2")], version="1.10.0"))
    assert executor.execute_flow("f", {"x": 0}).final_output == {"v": 2}
    old = executor.execute_flow("f", {"x": 0}, version="1.9")
    assert old.final_output == {"v": 1} and old.flow_version == "1.9.0"


# ------------------------------------------------------------------ failures


def test_tool_that_raises_stops_the_run_and_keeps_earlier_steps() -> None:
    @tool
    def prepare(order_id: str) -> dict:
        return {"order_id": order_id.strip()}

    registry, executor = build(prepare, fetch_order, format_price, summarize)
    registry.register_flow(Flow("f", "", [FlowStep("prepare")] + THREE_STEPS))
    result = executor.execute_flow("f", {"order_id": " boom "})
    assert result.success is False
    assert result.final_output is None
    assert result.error == ErrorInfo(
        "RuntimeError", "step 1 ('fetch_order') raised RuntimeError: database is down",
        step_index=1, tool_name="fetch_order", step_id="fetch_order",
    )
    assert [s.tool_name for s in result.steps] == ["prepare", "fetch_order"]
    assert result.steps[0].outputs == {"order_id": "boom"} and result.steps[0].error is None
    assert result.steps[1].error == result.error and result.steps[1].outputs is None
    assert result.steps[1].inputs == {"order_id": "boom"}
    assert CALLS == Counter({"fetch_order": 1})  # later tools never ran


def test_tool_exception_is_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    registry, executor = build()
    registry.register_flow(Flow("f", "", THREE_STEPS))
    with caplog.at_level(logging.DEBUG, logger="chainweaver.executor"):
        executor.execute_flow("f", {"order_id": "boom"})
    assert any(r.exc_info and "fetch_order" in r.getMessage() for r in caplog.records)


def test_wrong_output_shape_names_the_field() -> None:
    @tool(output_schema=Order)
    def bad_fetch(order_id: str) -> dict:
        return {"order_id": order_id, "status": "x", "total_cents": "lots"}

    registry, executor = build(bad_fetch, format_price)
    registry.register_flow(Flow("f", "", [FlowStep("bad_fetch"), FlowStep("format_price")]))
    result = executor.execute_flow("f", {"order_id": "A"})
    assert not result.success
    assert (result.error.type, result.error.step_index, result.error.tool_name,
            result.error.field) == ("StepOutputError", 0, "bad_fetch", "total_cents")
    assert "total_cents" in result.error.message
    assert len(result.steps) == 1


def test_non_mapping_output_is_an_output_error() -> None:
    @tool
    def returns_list(x: int):
        return [x]

    registry, executor = build(returns_list)
    registry.register_flow(Flow("f", "", [FlowStep("returns_list")]))
    result = executor.execute_flow("f", {"x": 1})
    assert result.error.type == "StepOutputError"
    assert result.error.tool_name == "returns_list" and result.error.step_index == 0
    assert "returned list" in result.error.message


def test_invalid_flow_input_names_the_field_and_runs_nothing() -> None:
    registry, executor = build()
    registry.register_flow(Flow("f", "", THREE_STEPS, input_schema=FlowIn))
    result = executor.execute_flow("f", {"currency": 5})
    assert not result.success
    assert result.error.type == "InputValidationError"
    assert result.error.field == "order_id"
    assert result.error.step_index is None
    assert "order_id: Field required" in result.error.message
    assert result.steps == []
    assert not CALLS


def test_invalid_input_without_flow_schema_uses_the_first_tools_schema() -> None:
    registry, executor = build()
    registry.register_flow(Flow("f", "", THREE_STEPS))
    result = executor.execute_flow("f", {"order_id": 42})
    assert result.error.type == "InputValidationError" and result.error.field == "order_id"


def test_mapping_to_a_missing_context_key() -> None:
    registry, executor = build()
    registry.register_flow(Flow("f", "", [
        FlowStep("fetch_order"), FlowStep("format_price", {"total_cents": "amount"}),
    ]))
    result = executor.execute_flow("f", {"order_id": "A"})
    assert not result.success
    assert result.error.type == "MissingContextKeyError"
    assert (result.error.step_index, result.error.tool_name, result.error.field) == (
        1, "format_price", "total_cents"
    )
    assert "'amount'" in result.error.message
    assert result.steps[0].error is None and result.steps[1].error == result.error


def test_unmapped_required_field_missing_from_context() -> None:
    registry, executor = build()
    registry.register_flow(Flow("f", "", [FlowStep("format_price")], input_schema=FlowIn))
    result = executor.execute_flow("f", {"order_id": "A"})
    assert result.error.type == "StepInputError"
    assert (result.error.step_index, result.error.tool_name, result.error.field) == (
        0, "format_price", "total_cents"
    )


def test_context_value_of_the_wrong_type_is_a_step_input_error() -> None:
    @tool
    def label(x: int) -> dict:
        return {"total_cents": "not a number"}

    registry, executor = build(label, format_price)
    registry.register_flow(Flow("f", "", [FlowStep("label"), FlowStep("format_price")]))
    result = executor.execute_flow("f", {"x": 1})
    assert result.error.type == "StepInputError"
    assert result.error.field == "total_cents" and result.error.step_index == 1
    assert result.steps[1].inputs == {"total_cents": "not a number"}


def test_unregistered_tool_fails_the_run() -> None:
    registry, executor = build(fetch_order)
    registry.register_flow(Flow("f", "", [FlowStep("fetch_order"), FlowStep("ghost")]))
    result = executor.execute_flow("f", {"order_id": "A"})
    assert not result.success
    assert (result.error.type, result.error.step_index, result.error.tool_name) == (
        "ToolNotFoundError", 1, "ghost"
    )
    assert result.steps == []
    assert not CALLS
    # registering the tool later makes the same flow runnable (no stale plan)
    @tool
    def ghost(order_id: str) -> dict:
        return {"ok": True}

    executor.register_tool(ghost)
    assert executor.execute_flow("f", {"order_id": "A"}).final_output == {"ok": True}


def test_flow_output_schema_that_the_context_cannot_fill() -> None:
    class Needs(BaseModel):
        missing: str

    registry, executor = build()
    registry.register_flow(Flow("f", "", THREE_STEPS, output_schema=Needs))
    result = executor.execute_flow("f", {"order_id": "A"})
    assert not result.success
    assert result.error.type == "OutputValidationError" and result.error.field == "missing"
    assert len(result.steps) == 3 and all(s.error is None for s in result.steps)


def test_unknown_flow_and_version_raise() -> None:
    registry, executor = build()
    registry.register_flow(Flow("f", "", THREE_STEPS))
    with pytest.raises(FlowNotFoundError):
        executor.execute_flow("nope", {})
    with pytest.raises(FlowVersionNotFoundError):
        executor.execute_flow("f", {"order_id": "A"}, version="9.9.9")


def test_error_info_is_frozen() -> None:
    info = ErrorInfo("T", "m")
    assert (info.step_index, info.tool_name, info.field) == (None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.type = "X"  # type: ignore[misc]


# ------------------------------------------------------------------ tools


def test_tool_registration() -> None:
    registry, executor = build()
    assert executor.get_tool("fetch_order") is fetch_order
    assert set(executor.tools) == {"fetch_order", "format_price", "summarize"}
    executor.tools.clear()  # a copy: the executor keeps its tools
    assert "summarize" in executor.tools
    with pytest.raises(DuplicateToolError):
        executor.register_tool(fetch_order)
    with pytest.raises(ToolNotFoundError) as caught:
        executor.get_tool("ghost")
    assert isinstance(caught.value, (ChainWeaverError, LookupError))
    with pytest.raises(TypeError):
        executor.register_tool(lambda x: x)  # type: ignore[arg-type]


# ---------------------------------------------------- schemas and safety


def test_input_and_output_models() -> None:
    registry, executor = build()
    plain = Flow("plain", "", THREE_STEPS)
    declared = Flow("declared", "", THREE_STEPS, input_schema=FlowIn, output_schema=FlowOut)
    assert executor.input_model(plain) is fetch_order.input_schema
    assert executor.output_model(plain) is Summary
    assert executor.input_model(declared) is FlowIn
    assert executor.output_model(declared) is FlowOut
    missing = Flow("m", "", [FlowStep("ghost")])
    assert executor.input_model(missing) is None
    assert executor.output_model(missing) is None
    no_output = Flow("n", "", [FlowStep("format_price")])
    assert executor.output_model(no_output) is None


def test_effective_safety() -> None:
    registry, executor = build(fetch_order, format_price, summarize, unsafe_echo)
    own = ToolSafetyContract("write", requires_approval=True)
    assert executor.effective_safety(Flow("f", "", THREE_STEPS, safety=own)) is own
    merged = executor.effective_safety(Flow("f", "", THREE_STEPS))
    assert merged == ToolSafetyContract(SideEffectLevel.READ)
    # a tool without a contract, or a missing tool, makes it unknown
    undeclared = Flow("f", "", [FlowStep("fetch_order"), FlowStep("unsafe_echo")])
    assert executor.effective_safety(undeclared) is None
    assert executor.effective_safety(Flow("f", "", [FlowStep("ghost")])) is None


def test_check_and_validate_flow() -> None:
    registry, executor = build()
    good = Flow("good", "", [FlowStep("fetch_order"), FlowStep("format_price", {"total_cents":
                                                                              "order_id"})])
    assert executor.check_flow(good) == []
    executor.validate_flow(good)
    bad = Flow("bad", "", [FlowStep("ghost"), FlowStep("format_price", {"amount": "x"})])
    problems = executor.check_flow(bad)
    assert problems == [
        "step 0 uses unregistered tool 'ghost'",
        "step 1 ('format_price') maps field 'amount', which the tool's input does not have "
        "(its fields: total_cents, currency)",
    ]
    with pytest.raises(FlowValidationError) as caught:
        executor.validate_flow(bad)
    assert caught.value.flow_name == "bad"
    assert caught.value.problems == problems
    assert "'ghost'" in str(caught.value) and isinstance(caught.value, ChainWeaverError)


# ------------------------------------------------------------------ async


def _thread_tools():
    threads: dict[str, int] = {}

    @tool
    def sync_step(x: int) -> dict:
        threads["sync_step"] = threading.get_ident()
        return {"y": x + 1}

    @tool
    async def async_step(y: int) -> dict:
        threads["async_step"] = threading.get_ident()
        await asyncio.sleep(0)
        return {"z": y * 10}

    @tool
    def sync_after(z: int) -> dict:
        threads["sync_after"] = threading.get_ident()
        return {"w": z - 1}

    return threads, (sync_step, async_step, sync_after)


@pytest.mark.anyio
async def test_async_execution_threads() -> None:
    threads, tools = _thread_tools()
    registry, executor = build(*tools)
    registry.register_flow(Flow("mixed", "", [FlowStep("sync_step"), FlowStep("async_step"),
                                             FlowStep("sync_after")]))
    result = await executor.execute_flow_async("mixed", {"x": 1})
    assert result.success, result.error
    assert result.final_output == {"w": 19}
    loop_thread = threading.get_ident()
    assert threads["async_step"] == loop_thread          # awaited natively
    assert threads["sync_step"] != loop_thread           # sync tools run in a worker thread
    assert threads["sync_after"] != loop_thread
    assert [s.tool_name for s in result.steps] == ["sync_step", "async_step", "sync_after"]


@pytest.mark.anyio
async def test_async_matches_sync_results() -> None:
    registry, executor = build()
    registry.register_flow(Flow("s", "", THREE_STEPS, input_schema=FlowIn, output_schema=FlowOut))
    sync_result = executor.execute_flow("s", {"order_id": "A"})
    async_result = await executor.execute_flow_async("s", {"order_id": "A"})
    assert async_result.final_output == sync_result.final_output
    assert [(s.inputs, s.outputs) for s in async_result.steps] == [
        (s.inputs, s.outputs) for s in sync_result.steps
    ]
    failed = await executor.execute_flow_async("s", {"order_id": "boom"})
    assert failed.error.type == "RuntimeError" and failed.error.step_index == 0
    invalid = await executor.execute_flow_async("s", {})
    assert invalid.error.type == "InputValidationError"


@pytest.mark.anyio
async def test_async_tool_failures() -> None:
    @tool
    async def explode(x: int) -> dict:
        raise ValueError("bad x")

    @tool
    async def wrong_shape(x: int) -> Summary:
        return {"nope": 1}  # type: ignore[return-value]

    @tool
    async def ok(x: int) -> dict:
        return {"x": x}

    registry, executor = build(explode, wrong_shape, ok)
    registry.register_flow(Flow("a", "", [FlowStep("ok"), FlowStep("explode")]))
    registry.register_flow(Flow("b", "", [FlowStep("wrong_shape")]))
    registry.register_flow(Flow("c", "", [FlowStep("ok", id="first"),
                                          FlowStep("ok", {"x": "y"}, id="second")]))
    a = await executor.execute_flow_async("a", {"x": 1})
    assert (a.error.type, a.error.step_index, a.error.tool_name) == ("ValueError", 1, "explode")
    assert len(a.steps) == 2 and a.steps[0].outputs == {"x": 1}
    b = await executor.execute_flow_async("b", {"x": 1})
    assert (b.error.type, b.error.field) == ("StepOutputError", "summary")
    c = await executor.execute_flow_async("c", {"x": 1})
    assert (c.error.type, c.error.field) == ("MissingContextKeyError", "x")
    with pytest.raises(FlowNotFoundError):
        await executor.execute_flow_async("zzz", {})


@pytest.mark.anyio
async def test_async_timeout_on_an_async_tool_keeps_finished_steps() -> None:
    never = asyncio.Event()

    @tool
    def first(x: int) -> dict:
        return {"x": x}

    @tool
    async def hang(x: int) -> dict:
        await never.wait()
        return {}

    registry, executor = build(first, hang)
    registry.register_flow(Flow("slow", "", [FlowStep("first"), FlowStep("hang")]))
    result = await executor.execute_flow_async("slow", {"x": 1}, timeout=0.05)
    assert not result.success
    assert result.error.type == "TimeoutError"
    assert (result.error.step_index, result.error.tool_name) == (1, "hang")
    assert result.steps[0].outputs == {"x": 1}


@pytest.mark.anyio
async def test_async_timeout_on_a_blocked_sync_tool() -> None:
    release = threading.Event()

    @tool
    def block(x: int) -> dict:
        release.wait(10)
        return {"x": x}

    registry, executor = build(block)
    registry.register_flow(Flow("blocked", "", [FlowStep("block")]))
    try:
        result = await executor.execute_flow_async("blocked", {"x": 1}, timeout=0.05)
    finally:
        release.set()
    assert result.error.type == "TimeoutError"
    assert "within 0.05 s" in result.error.message


@pytest.mark.anyio
async def test_after_a_timeout_no_further_step_starts_and_the_result_stays_put() -> None:
    release = threading.Event()
    finished = threading.Event()
    ran: list[str] = []

    @tool
    def block(x: int) -> dict:
        release.wait(10)
        ran.append("block")
        return {"x": x}

    @tool
    def after(x: int) -> dict:
        ran.append("after")  # e.g. a write that must not happen once the caller gave up
        finished.set()
        return {"x": x}

    registry, executor = build(block, after)
    registry.register_flow(Flow("two", "", [FlowStep("block"), FlowStep("after")]))
    result = await executor.execute_flow_async("two", {"x": 1}, timeout=0.05)
    assert result.error.type == "TimeoutError"
    snapshot = [dataclasses.asdict(record) for record in result.steps]
    release.set()  # the stuck step now finishes in its thread...
    await asyncio.to_thread(finished.wait, 0.5)
    await asyncio.sleep(0.05)
    assert ran == ["block"]  # ...and the next step never starts
    assert [dataclasses.asdict(record) for record in result.steps] == snapshot
    assert result.steps[0].outputs is None


@pytest.mark.anyio
async def test_async_timeout_not_reached() -> None:
    registry, executor = build()
    registry.register_flow(Flow("s", "", THREE_STEPS))
    result = await executor.execute_flow_async("s", {"order_id": "A"}, timeout=30)
    assert result.success


def test_timeout_before_any_step_names_no_step() -> None:
    """A timeout that fires before the first step starts has no step to blame."""
    registry, executor = build()
    registry.register_flow(Flow("s", "", THREE_STEPS))

    async def run() -> ExecutionResult:
        return await executor.execute_flow_async("s", {"order_id": "A"}, timeout=0)

    result = asyncio.run(run())
    assert result.error.type == "TimeoutError"
    assert result.error.step_index is None and result.error.tool_name is None
    assert result.steps == []


def test_sync_execution_of_async_tools() -> None:
    @tool
    async def double(x: int) -> dict:
        await asyncio.sleep(0)
        return {"x": 2 * x}

    registry, executor = build(double)
    registry.register_flow(Flow("d", "", [FlowStep("double", id=f"d{i}") for i in range(3)]))
    assert executor.execute_flow("d", {"x": 1}).final_output == {"x": 8}


@pytest.mark.anyio
async def test_sync_execution_of_async_tools_inside_a_running_loop() -> None:
    @tool
    async def double(x: int) -> dict:
        return {"x": 2 * x}

    registry, executor = build(double)
    registry.register_flow(Flow("d", "", [FlowStep("double")]))
    assert executor.execute_flow("d", {"x": 2}).final_output == {"x": 4}


class Request(BaseModel):
    quantity: int = Field(ge=1)


def test_pydantic_model_tool_with_field_constraints() -> None:
    @tool
    def reserve(request: Request) -> dict:
        return {"reserved": request.quantity}

    registry, executor = build(reserve)
    registry.register_flow(Flow("r", "", [FlowStep("reserve")]))
    assert executor.execute_flow("r", {"quantity": 2}).final_output == {"reserved": 2}
    result = executor.execute_flow("r", {"quantity": 0})
    assert (result.error.type, result.error.field) == ("InputValidationError", "quantity")


class Range(BaseModel):
    low: int
    high: int

    @model_validator(mode="after")
    def ordered(self) -> Range:
        if self.low > self.high:
            raise ValueError("low must not exceed high")
        return self


def test_model_level_validation_error_names_no_field() -> None:
    @tool
    def check(low: int, high: int) -> dict:
        return {"low": high, "high": low}

    registry, executor = build(check)
    registry.register_flow(Flow("f", "", [FlowStep("check")], output_schema=Range))
    result = executor.execute_flow("f", {"low": 1, "high": 2})
    assert result.error.type == "OutputValidationError"
    assert result.error.field is None
    assert "(root): Value error, low must not exceed high" in result.error.message
