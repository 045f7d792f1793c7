"""ChainWeaver engine quick start: a three-step order flow, run, then its step log.

    python examples/engine_quickstart.py

Steps: look up an order, price it in the customer's currency, write a one-line summary.
The second run asks for an order that does not exist, to show how a failure is reported.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from chainweaver import (
    ExecutionResult,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)

ORDERS = {
    "A-1001": {"customer": "Ada", "status": "shipped", "items": [1999, 2500, 499]},
    "A-1002": {"customer": "Grace", "status": "packing", "items": [12000]},
}
RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85}


class Order(BaseModel):
    order_id: str
    customer: str
    status: str
    subtotal_cents: int


class Price(BaseModel):
    total: str = Field(description="Formatted total, including tax")


class OrderSummaryInput(BaseModel):
    order_id: str = Field(examples=["A-1001"])
    currency: str = Field("EUR", pattern="^[A-Z]{3}$")


class OrderSummary(BaseModel):
    status: str
    total: str
    summary: str


@tool(safety=ToolSafetyContract("read"))
def fetch_order(order_id: str) -> Order:
    """Fetch an order from the order store."""
    record = ORDERS.get(order_id)
    if record is None:
        raise LookupError(f"no order {order_id!r}")
    return Order(order_id=order_id, customer=record["customer"], status=record["status"],
                 subtotal_cents=sum(record["items"]))


@tool(safety=ToolSafetyContract("none"))
def price_order(subtotal_cents: int, currency: str, tax_rate: float = 0.2) -> Price:
    """Add tax and convert the subtotal into the customer's currency."""
    amount = subtotal_cents * (1 + tax_rate) * RATES[currency] / 100
    return Price(total=f"{amount:,.2f} {currency}")


@tool(safety=ToolSafetyContract("none"))
def summarize(name: str, order_id: str, status: str, total: str) -> dict:
    """Write a one-line summary for the customer."""
    return {"summary": f"Hi {name}, order {order_id} is {status}; total {total}."}


def build() -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for t in (fetch_order, price_order, summarize):
        executor.register_tool(t)
    registry.register_flow(Flow(
        "order_summary",
        "Look up an order, price it and summarise it for the customer.",
        steps=[
            FlowStep("fetch_order"),
            FlowStep("price_order"),
            FlowStep("summarize", {"name": "customer"}),  # tool field <- context key
        ],
        version="1.0.0",
        input_schema=OrderSummaryInput,
        output_schema=OrderSummary,
    ))
    executor.validate_flow(registry.get_flow("order_summary"))
    return executor


def report(result: ExecutionResult) -> None:
    print(f"{result.flow_name} {result.flow_version}: success={result.success}")
    if result.success:
        print(f"  output: {result.final_output}")
    else:
        error = result.error
        print(f"  error: {error.type} at step {error.step_index} ({error.tool_name}): "
              f"{error.message}")
    for step in result.steps:
        outcome = step.outputs if step.error is None else f"FAILED ({step.error.type})"
        print(f"  step {step.index} {step.tool_name:<12} {step.duration_ms:7.3f} ms  "
              f"in={step.inputs} out={outcome}")


def main() -> int:
    executor = build()
    ok = executor.execute_flow("order_summary", {"order_id": "A-1001", "currency": "USD"})
    report(ok)
    safety = executor.effective_safety(executor.registry.get_flow("order_summary"))
    print(f"  effective safety: {safety.side_effects}, idempotent={safety.idempotent}")
    missing = executor.execute_flow("order_summary", {"order_id": "A-9999"})
    report(missing)
    return 0 if ok.success and not missing.success else 1


if __name__ == "__main__":
    raise SystemExit(main())
