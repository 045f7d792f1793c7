"""Flows as MCP tools, seen by a real (in-memory) MCP client: schemas, titles, metadata,
annotations, results, argument checking, failures and the invisibility of excluded flows."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import pytest
from fastmcp import Client
from pydantic import BaseModel, field_serializer, model_validator
from support.catalogue import CALLS, EXPOSED, OrderInput, OrderStatus, SearchInput, build_catalogue

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import ExposurePolicy, FlowServer, SecurityConfig, ServingConfig

ALL_SIDE_EFFECTS = list(SideEffectLevel)


class Address(BaseModel):
    city: str


class Customer(BaseModel):
    name: str
    address: Address


def catalogue_without(*names: str) -> FlowExecutor:
    """The catalogue as if ``names`` had never been registered."""
    full = build_catalogue()
    executor = FlowExecutor(FlowRegistry())
    for t in full.tools.values():
        executor.register_tool(t)
    for flow in full.registry.list_flows():
        if flow.name not in names:
            executor.registry.register_flow(flow)
    return executor


async def tools_by_name(server: FlowServer) -> dict[str, Any]:
    async with Client(server.fastmcp) as client:
        return {t.name: t for t in await client.list_tools()}


def dump(result: Any) -> str:
    """A CallToolResult as canonical JSON, for byte-for-byte comparisons."""
    return json.dumps({
        "content": [block.model_dump(mode="json") for block in result.content],
        "structured_content": result.structured_content,
        "meta": result.meta,
        "data": result.data,
        "is_error": result.is_error,
    }, sort_keys=True)


# ------------------------------------------------------------- tool definitions


@pytest.mark.anyio
async def test_input_schema_is_the_flow_input_json_schema() -> None:
    tools = await tools_by_name(FlowServer(build_catalogue()))
    assert tools["product_search"].input_schema == SearchInput.model_json_schema()
    # order_status declares its own input model, which wins over its first tool's.
    assert tools["order_status"].input_schema == OrderInput.model_json_schema()
    for t in tools.values():
        jsonschema.Draft202012Validator.check_schema(t.input_schema)


@pytest.mark.anyio
async def test_nested_models_are_published_without_refs() -> None:
    @tool(safety=ToolSafetyContract(SideEffectLevel.NONE))
    def greet(data: Customer) -> dict:
        return {"text": f"Hello {data.name} from {data.address.city}"}

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(greet)
    executor.registry.register_flow(Flow("greet", "Greet.", [FlowStep("greet")]))
    server = FlowServer(executor)
    schema = (await tools_by_name(server))["greet"].input_schema
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    arguments = {"name": "Ada", "address": {"city": "London"}}
    jsonschema.validate(arguments, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "Ada", "address": {}}, schema)
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("greet", arguments)
    assert result.content[0].text == '{"text": "Hello Ada from London"}'


@pytest.mark.anyio
async def test_output_schema_and_structured_content_when_the_output_is_known() -> None:
    server = FlowServer(build_catalogue())
    tools = await tools_by_name(server)
    assert tools["order_status"].output_schema == OrderStatus.model_json_schema()
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("order_status", {"order_id": "A-1001"})
    assert not result.is_error
    assert result.structured_content == {
        "order_id": "A-1001", "status": "shipped",
        "summary": "Order A-1001 is shipped with DHL.",
    }
    jsonschema.validate(result.structured_content, tools["order_status"].output_schema)
    assert json.loads(result.content[0].text) == result.structured_content


@pytest.mark.anyio
async def test_no_output_schema_and_no_structured_content_when_the_output_is_unknown() -> None:
    # write_note returns a plain dict: the flow's output shape is not declared.
    server = FlowServer(
        build_catalogue(),
        policy=ExposurePolicy(flow_names=["write_flow"], allowed_side_effects=["write"]),
    )
    tools = await tools_by_name(server)
    assert tools["write_flow"].output_schema is None
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("write_flow", {"query": "note"})
    assert not result.is_error
    assert result.structured_content is None
    assert json.loads(result.content[0].text) == {"written": "note"}


@pytest.mark.anyio
async def test_title_is_the_flow_title_or_its_humanised_name() -> None:
    tools = await tools_by_name(FlowServer(build_catalogue()))
    assert tools["product_search"].title == "Product search"
    assert tools["order_status"].title == "Order Status"
    assert tools["price_quote"].title == "Price Quote"
    assert tools["order_status"].description == "Look up an order and summarise where it is."


@pytest.mark.anyio
async def test_meta_carries_flow_name_version_lifecycle_owner_and_safety() -> None:
    tools = await tools_by_name(FlowServer(
        build_catalogue(),
        policy=ExposurePolicy(server_prefix="shop"),
    ))
    meta = tools["shop__order_status"].meta["chainweaver"]
    assert meta["flow"] == "order_status"
    assert meta["version"] == "2.1.0"
    assert meta["lifecycle"] == "active"
    assert meta["owner"] == "orders-team"
    # fetch_order (read) + summarise_order (none) merge to read.
    assert meta["safety"]["side_effects"] == "read"
    assert meta["safety"]["idempotent"] is True
    assert meta["safety"]["requires_approval"] is False


# ------------------------------------------------------------------ annotations


def hints(t: Any) -> tuple[bool, bool, bool, bool]:
    a = t.annotations
    return a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint


@pytest.mark.anyio
async def test_annotations_follow_the_effective_safety() -> None:
    executor = build_catalogue()

    @tool(safety=ToolSafetyContract(SideEffectLevel.READ, open_world=True))
    def web_lookup(query: str) -> dict:
        return {"query": query}

    @tool(safety=ToolSafetyContract(SideEffectLevel.EXTERNAL))
    def post_webhook(query: str) -> dict:
        return {"posted": query}

    executor.register_tool(web_lookup)
    executor.register_tool(post_webhook)
    executor.registry.register_flow(Flow("web_search", "Search the web.",
                                         [FlowStep("web_lookup")]))
    executor.registry.register_flow(Flow("webhook", "Post a webhook.",
                                         [FlowStep("post_webhook")]))
    server = FlowServer(
        executor,
        policy=ExposurePolicy(
            allowed_side_effects=ALL_SIDE_EFFECTS,
            allow_requires_approval=True,
        ),
    )
    tools = await tools_by_name(server)
    #                                 readOnly, destructive, idempotent, openWorld
    assert hints(tools["product_search"]) == (True, False, True, False)
    assert hints(tools["price_quote"]) == (True, False, True, False)
    assert hints(tools["needs_approval"]) == (True, False, True, False)
    assert hints(tools["write_flow"]) == (False, False, False, False)
    assert hints(tools["idempotent_write"]) == (False, False, True, False)
    assert hints(tools["destructive_flow"]) == (False, True, False, False)
    assert hints(tools["external_flow"]) == (False, False, False, True)
    assert hints(tools["webhook"]) == (False, False, False, True)
    assert hints(tools["web_search"]) == (True, False, True, True)
    assert tools["product_search"].annotations.title == "Product search"


@pytest.mark.anyio
async def test_forced_flow_with_unknown_safety_is_annotated_worst_case() -> None:
    server = FlowServer(
        build_catalogue(),
        policy=ExposurePolicy(force_expose=True, flow_names=["unknown_safety"]),
    )
    t = (await tools_by_name(server))["unknown_safety"]
    assert hints(t) == (False, True, False, True)
    assert t.meta["chainweaver"]["safety"] is None
    assert t.meta["chainweaver"]["forced"] is True


# ------------------------------------------------------- excluded == nonexistent


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["write_flow", "draft_report", "unknown_safety",
                                  "needs_approval", "destructive_flow"])
async def test_an_excluded_flow_answers_exactly_like_a_tool_that_never_existed(
    name: str,
) -> None:
    governed = FlowServer(build_catalogue())
    absent = FlowServer(catalogue_without(name))
    before = CALLS.copy()
    async with Client(governed.fastmcp) as a, Client(absent.fastmcp) as b:
        assert name not in {t.name for t in await a.list_tools()}
        arguments = {"query": "anything"}
        excluded = await a.call_tool(name, arguments, raise_on_error=False)
        never = await b.call_tool(name, arguments, raise_on_error=False)
    assert excluded.is_error
    assert dump(excluded) == dump(never)
    assert CALLS == before  # the excluded flow's tool never ran


@pytest.mark.anyio
async def test_a_flow_left_out_of_flow_names_is_uncallable_too() -> None:
    server = FlowServer(build_catalogue(), policy=ExposurePolicy(flow_names=["price_quote"]))
    absent = FlowServer(
        catalogue_without("product_search"),
        policy=ExposurePolicy(flow_names=["price_quote"]),
    )
    async with Client(server.fastmcp) as a, Client(absent.fastmcp) as b:
        left_out = await a.call_tool("product_search", {"query": "q"}, raise_on_error=False)
        never = await b.call_tool("product_search", {"query": "q"}, raise_on_error=False)
    assert dump(left_out) == dump(never)


@pytest.mark.anyio
async def test_the_latest_version_is_served_and_older_ones_are_not_published() -> None:
    server = FlowServer(build_catalogue())
    async with Client(server.fastmcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
        assert tools["order_status"].meta["chainweaver"]["version"] == "2.1.0"
        result = await client.call_tool("order_status", {"order_id": "A-7"})
    # 1.9.0 only fetched the record (order_id, status, carrier); 2.1.0 summarises it.
    assert set(result.structured_content) == {"order_id", "status", "summary"}
    assert [n for n in tools if n.startswith("order_status")] == ["order_status"]


# ------------------------------------------------------------ argument checking


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tool_name", "arguments", "field"),
    [
        ("product_search", {"query": "shoes", "limit": "many"}, "limit"),
        ("product_search", {"query": "shoes", "limit": 500}, "limit"),
        ("product_search", {"query": "shoes", "sort": "random"}, "sort"),
        ("product_search", {"limit": 2}, "query"),
        ("order_status", {"order_id": "B-17"}, "order_id"),
        ("order_status", {}, "order_id"),
        ("price_quote", {"sku": "S", "quantity": 0}, "quantity"),
    ],
)
async def test_bad_arguments_are_an_error_result_naming_the_field_and_nothing_runs(
    tool_name: str, arguments: dict[str, Any], field: str
) -> None:
    server = FlowServer(build_catalogue(), security=SecurityConfig(error_detail="generic"))
    before = CALLS.copy()
    async with Client(server.fastmcp) as client:
        result = await client.call_tool(tool_name, arguments, raise_on_error=False)
    assert result.is_error
    text = result.content[0].text
    assert text.startswith(f"Invalid arguments for '{tool_name}'")
    assert field in text
    assert CALLS == before  # validated before the first step


@pytest.mark.anyio
async def test_good_arguments_use_the_schema_defaults() -> None:
    server = FlowServer(build_catalogue())
    before = CALLS["search_products"]
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("product_search", {"query": "boots"})
    assert result.structured_content == {"items": ["boots #0", "boots #1", "boots #2"],
                                         "total": 3}
    assert CALLS["search_products"] == before + 1


@pytest.mark.anyio
async def test_async_tools_run_through_the_mcp_call_path() -> None:
    server = FlowServer(build_catalogue())
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("price_quote", {"sku": "SKU-9", "quantity": 3})
    assert result.structured_content == {"sku": "SKU-9", "total_cents": 2997}


# -------------------------------------------------------------------- failures


async def failing_text(error_detail: str) -> str:
    server = FlowServer(build_catalogue(), security=SecurityConfig(error_detail=error_detail))
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("failing_flow", {"query": "x"}, raise_on_error=False)
    assert result.is_error
    assert result.structured_content is None
    return result.content[0].text


@pytest.mark.anyio
async def test_error_detail_full_gives_type_and_message() -> None:
    text = await failing_text("full")
    assert text.startswith("RuntimeError")
    assert "database password is hunter2" in text


@pytest.mark.anyio
async def test_error_detail_type_only_gives_just_the_type() -> None:
    assert await failing_text("type_only") == "RuntimeError"


@pytest.mark.anyio
async def test_error_detail_generic_reveals_nothing() -> None:
    text = await failing_text("generic")
    assert "hunter2" not in text
    assert "RuntimeError" not in text
    assert "explode" not in text
    assert text


@pytest.mark.anyio
async def test_the_server_keeps_serving_after_failures() -> None:
    server = FlowServer(build_catalogue(), security=SecurityConfig(error_detail="generic"))
    async with Client(server.fastmcp) as client:
        for _ in range(3):
            failed = await client.call_tool("failing_flow", {"query": "x"},
                                            raise_on_error=False)
            assert failed.is_error
            bad = await client.call_tool("order_status", {"order_id": 5},
                                         raise_on_error=False)
            assert bad.is_error
            missing = await client.call_tool("nope", {}, raise_on_error=False)
            assert missing.is_error
        ok = await client.call_tool("order_status", {"order_id": "A-2"})
        assert not ok.is_error
        assert ok.structured_content["order_id"] == "A-2"
        assert {t.name for t in await client.list_tools()} == set(EXPOSED)


@pytest.mark.anyio
async def test_a_flow_timeout_is_an_error_result_not_a_hang() -> None:
    @tool(safety=ToolSafetyContract(SideEffectLevel.NONE))
    async def stall(seconds: float) -> dict:
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(stall)
    executor.registry.register_flow(Flow("stall", "Sleep.", [FlowStep("stall")]))
    server = FlowServer(
        executor,
        security=SecurityConfig(error_detail="type_only"),
        serving=ServingConfig(flow_timeout=0.2),
    )
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("stall", {"seconds": 600}, raise_on_error=False)
    assert result.is_error and result.content[0].text == "TimeoutError"


# ------------------------------------------- failures outside the tool function


class _Picky(BaseModel):
    code: str

    @model_validator(mode="after")
    def _lookup(self) -> _Picky:
        {"known": 1}[self.code]  # a validator bug: KeyError, not a ValueError
        return self


class _Loud(BaseModel):
    value: str

    @field_serializer("value")
    def _dump(self, value: str) -> str:
        raise RuntimeError("serializer secret hunter2")


class _Ratio(BaseModel):
    ratio: float


@tool(safety=ToolSafetyContract(SideEffectLevel.NONE))
def picky(data: _Picky) -> dict:
    return {"ok": True}


@tool(safety=ToolSafetyContract(SideEffectLevel.NONE))
def loud(code: str) -> _Loud:
    return _Loud(value=code)


@tool(safety=ToolSafetyContract(SideEffectLevel.NONE))
def not_a_number(code: str) -> _Ratio:
    return _Ratio(ratio=float("nan"))


def _fragile_server(error_detail: str) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    for each in (picky, loud, not_a_number):
        executor.register_tool(each)
        executor.registry.register_flow(Flow(f"{each.name}_flow", "Fragile.",
                                             [FlowStep(each.name)]))
    return FlowServer(executor, security=SecurityConfig(error_detail=error_detail))


@pytest.mark.anyio
@pytest.mark.parametrize(("error_detail", "expected"), [
    ("type_only", {"picky_flow": "KeyError", "loud_flow": "PydanticSerializationError",
                   "not_a_number_flow": "OutputSerializationError"}),
    ("generic", dict.fromkeys(["picky_flow", "loud_flow", "not_a_number_flow"],
                              "The flow failed. Ask the server operator to check its logs.")),
])
async def test_validator_serializer_and_nan_failures_follow_error_detail(
    error_detail: str, expected: dict[str, str]
) -> None:
    async with Client(_fragile_server(error_detail).fastmcp) as client:
        for name, text in expected.items():
            result = await client.call_tool(name, {"code": "hunter2"}, raise_on_error=False)
            assert result.is_error and result.content[0].text == text
            assert "hunter2" not in result.content[0].text
        # The server goes on serving.
        assert len(await client.list_tools()) == 3


@pytest.mark.anyio
async def test_nan_output_is_an_error_not_invalid_json() -> None:
    async with Client(_fragile_server("full").fastmcp) as client:
        result = await client.call_tool("not_a_number_flow", {"code": "x"},
                                        raise_on_error=False)
    assert result.is_error and result.structured_content is None
    # Python 3.13 adds the value (": nan") to the encoder's message.
    assert result.content[0].text.startswith(
        "OutputSerializationError: flow 'not_a_number_flow' output cannot be sent as JSON: "
        "Out of range float values are not JSON compliant")
