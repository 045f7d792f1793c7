"""A shared, realistic catalogue of tools and flows for the MCP tests.

Exposed under the default policy: ``product_search``, ``order_status``, ``price_quote``.
Each other flow is excluded for one reason (see ``EXCLUDED``). ``CALLS`` counts tool
invocations so tests can prove that rendering prompts never runs a tool.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Literal

from pydantic import BaseModel, Field

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowLifecycle,
    FlowPrompt,
    FlowRegistry,
    FlowStep,
    PromptArgument,
    PromptMessage,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)

CALLS: Counter[str] = Counter()

READ = ToolSafetyContract(SideEffectLevel.READ)
NONE = ToolSafetyContract(SideEffectLevel.NONE)


class SearchInput(BaseModel):
    query: str = Field(description="What to look for", examples=["red shoes"])
    limit: int = Field(5, ge=1, le=50, description="Maximum number of results")
    sort: Literal["relevance", "price"] = Field("relevance", description="Result order")
    in_stock: bool = Field(False, description="Only items in stock")


class SearchOutput(BaseModel):
    items: list[str] = Field(description="Matching product names")
    total: int = Field(description="How many items matched")


class OrderInput(BaseModel):
    order_id: str = Field(description="Order number", examples=["A-1001"], pattern=r"^A-\d+$")


class OrderRecord(BaseModel):
    order_id: str
    status: Literal["open", "shipped", "delivered"]
    carrier: str


class OrderStatus(BaseModel):
    order_id: str = Field(description="Order number")
    status: str = Field(description="Where the order is")
    summary: str = Field(description="One line for the customer")


class QuoteInput(BaseModel):
    sku: str = Field(description="Product SKU", examples=["SKU-1"])
    quantity: int = Field(1, ge=1, description="How many")
    tags: list[str] = Field(default_factory=list, description="Optional labels")


class Quote(BaseModel):
    sku: str
    total_cents: int = Field(description="Total price in cents")


@tool(safety=READ)
def search_products(data: SearchInput) -> SearchOutput:
    """Search the product catalogue."""
    CALLS["search_products"] += 1
    items = [f"{data.query} #{i}" for i in range(min(data.limit, 3))]
    return SearchOutput(items=items, total=len(items))


@tool(safety=READ)
def fetch_order(order_id: str) -> OrderRecord:
    """Fetch an order record."""
    CALLS["fetch_order"] += 1
    return OrderRecord(order_id=order_id, status="shipped", carrier="DHL")


@tool(safety=NONE)
def summarise_order(order_id: str, status: str, carrier: str) -> OrderStatus:
    """Summarise an order for a customer."""
    CALLS["summarise_order"] += 1
    return OrderStatus(order_id=order_id, status=status,
                       summary=f"Order {order_id} is {status} with {carrier}.")


@tool(safety=NONE)
async def quote_price(data: QuoteInput) -> Quote:
    """Quote a price (async)."""
    CALLS["quote_price"] += 1
    await asyncio.sleep(0)
    return Quote(sku=data.sku, total_cents=999 * data.quantity)


@tool  # declares no safety contract
def untyped_lookup(query: str) -> dict:
    CALLS["untyped_lookup"] += 1
    return {"query": query}


@tool(safety=ToolSafetyContract(SideEffectLevel.WRITE))
def write_note(query: str) -> dict:
    CALLS["write_note"] += 1
    return {"written": query}


@tool(safety=ToolSafetyContract(SideEffectLevel.WRITE, idempotent=True))
def upsert_note(query: str) -> dict:
    CALLS["upsert_note"] += 1
    return {"upserted": query}


@tool(safety=ToolSafetyContract(SideEffectLevel.DESTRUCTIVE))
def delete_note(query: str) -> dict:
    CALLS["delete_note"] += 1
    return {"deleted": query}


@tool(safety=ToolSafetyContract(SideEffectLevel.EXTERNAL, open_world=True))
def send_email(query: str) -> dict:
    CALLS["send_email"] += 1
    return {"sent": query}


@tool(safety=ToolSafetyContract(SideEffectLevel.READ, requires_approval=True,
                                approval_reason="reads personal data"))
def read_customer(query: str) -> dict:
    CALLS["read_customer"] += 1
    return {"customer": query}


@tool(safety=READ)
def explode(query: str) -> dict:
    raise RuntimeError("database password is hunter2")


ALL_TOOLS = [search_products, fetch_order, summarise_order, quote_price, untyped_lookup,
             write_note, upsert_note, delete_note, send_email, read_customer, explode]

SEARCH_PROMPTS = [
    FlowPrompt(
        "compare",
        title="Compare two products",
        description="Ask for a comparison of two products.",
        arguments=[PromptArgument("first", "First product", required=True),
                   PromptArgument("second", "Second product", required=True),
                   PromptArgument("focus", "What matters most")],
        messages=[PromptMessage("user", "Compare {{ first }} with {{ second }}. "
                                        "Focus on: {{ focus }}.")],
    ),
    FlowPrompt(
        "brief",
        title="Dynamic brief",
        description="Wording depends on the audience.",
        arguments=[PromptArgument("audience", "Who reads it", required=True)],
        messages=lambda args: [PromptMessage(
            "user", "Write for experts about {{ audience }}." if args["audience"] == "experts"
            else "Write a plain brief for {{ audience }}.")],
    ),
]

# flow name -> the policy that excludes it under the default FlowServer settings
EXCLUDED = {
    "draft_report": "lifecycle",
    "archived_search": "lifecycle",
    "unknown_safety": "unknown safety",
    "write_flow": "side effects",
    "idempotent_write": "side effects",
    "destructive_flow": "side effects",
    "external_flow": "side effects",
    "needs_approval": "approval",
    "failing_flow": None,  # exposed: a read flow whose tool raises
}
EXPOSED = ["product_search", "order_status", "price_quote", "failing_flow"]


def build_catalogue() -> FlowExecutor:
    """A fresh registry + executor with every catalogue tool and flow registered."""
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for t in ALL_TOOLS:
        executor.register_tool(t)
    flows = [
        Flow("product_search", "Search the product catalogue by text.",
             [FlowStep("search_products")], title="Product search",
             governance=FlowGovernance(owner="search-team"), prompts=SEARCH_PROMPTS),
        Flow("order_status", "Look up an order and summarise where it is.",
             [FlowStep("fetch_order"), FlowStep("summarise_order")], version="2.1.0",
             input_schema=OrderInput, output_schema=OrderStatus,
             governance=FlowGovernance(owner="orders-team")),
        Flow("order_status", "Old version.", [FlowStep("fetch_order")], version="1.9.0",
             governance=FlowGovernance(owner="orders-team")),
        Flow("price_quote", "Quote the price of a product.", [FlowStep("quote_price")],
             governance=FlowGovernance(owner="pricing-team")),
        Flow("failing_flow", "A read flow whose tool fails.", [FlowStep("explode")],
             governance=FlowGovernance(owner="search-team")),
        Flow("draft_report", "Draft report.", [FlowStep("search_products")],
             governance=FlowGovernance(FlowLifecycle.DRAFT, owner="search-team"),
             prompts=[FlowPrompt("secret", messages=[PromptMessage("user", "draft")])]),
        Flow("archived_search", "Archived.", [FlowStep("search_products")],
             governance=FlowGovernance(FlowLifecycle.ARCHIVED)),
        Flow("unknown_safety", "No contract.", [FlowStep("untyped_lookup")]),
        Flow("write_flow", "Writes.", [FlowStep("write_note")]),
        Flow("idempotent_write", "Upserts.", [FlowStep("upsert_note")]),
        Flow("destructive_flow", "Deletes.", [FlowStep("delete_note")]),
        Flow("external_flow", "Sends email.", [FlowStep("send_email")]),
        Flow("needs_approval", "Reads customers.", [FlowStep("read_customer")]),
    ]
    for flow in flows:
        registry.register_flow(flow)
    return executor


def opted_out_catalogue(name: str = "product_search") -> FlowExecutor:
    """The catalogue with a newer version of ``name`` that opts out of publishing."""
    executor = build_catalogue()
    flow = executor.registry.latest_active(name)
    assert flow is not None
    executor.registry.register_flow(dataclasses.replace(
        flow, version="9.0.0", governance=FlowGovernance(publish=False)))
    return executor
