"""Tools for the flow files in examples/flows/: a small online shop's support desk.

Serve the flows with these tools (from the repository root):

    chainweaver serve examples/flows --tools examples/flow_tools.py --expose-prompts
    chainweaver inspect examples/flows --tools examples/flow_tools.py

``--tools`` with a file path imports this file as the module ``flow_tools`` and puts
its directory on ``sys.path``, which is why the flow files reference models here as
``flow_tools:OrderQuery``. Every module-level ``Tool`` object is registered.

Data is in memory so the example runs anywhere; a real module would call databases
and services here, and the flow files would not change.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from chainweaver import SideEffectLevel, ToolSafetyContract, tool

READ = ToolSafetyContract(SideEffectLevel.READ)
PURE = ToolSafetyContract(SideEffectLevel.NONE)

ORDERS = {
    "A-1001": {"customer_id": "C-7", "status": "shipped", "total_cents": 4599,
               "currency": "EUR", "carrier": "DHL", "tracking_code": "JD0142"},
    "A-1002": {"customer_id": "C-9", "status": "processing", "total_cents": 1250,
               "currency": "EUR", "carrier": "none", "tracking_code": ""},
    "A-1003": {"customer_id": "C-7", "status": "delivered", "total_cents": 8900,
               "currency": "GBP", "carrier": "UPS", "tracking_code": "1Z999"},
}
ARTICLES = [
    {"id": "kb-12", "area": "shipping", "title": "Where is my parcel?"},
    {"id": "kb-31", "area": "shipping", "title": "Shipping to another country"},
    {"id": "kb-40", "area": "returns", "title": "Returning an item within 30 days"},
    {"id": "kb-41", "area": "returns", "title": "Refund timelines"},
    {"id": "kb-55", "area": "payments", "title": "Paying by invoice"},
]
EUR_RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85}

ProductArea = Literal["any", "shipping", "returns", "payments"]


# ------------------------------------------------------------------ models


class OrderQuery(BaseModel):
    """Input of the order_status flow (referenced as flow_tools:OrderQuery)."""

    order_id: str = Field(description="Order number, as printed on the receipt",
                          pattern=r"^A-\d{4}$", examples=["A-1001"])


class OrderRecord(BaseModel):
    order_id: str
    customer_id: str
    status: Literal["processing", "shipped", "delivered"]
    total_cents: int
    currency: str
    carrier: str
    tracking_code: str


class Tracking(BaseModel):
    eta: str = Field(description="Expected delivery, or why there is none")
    last_scan: str = Field(description="The carrier's latest event")


class Articles(BaseModel):
    """Output of the help_search flow (referenced as flow_tools:Articles)."""

    articles: list[str] = Field(description="Matching article titles, best first")
    article_ids: list[str] = Field(description="Their knowledge-base ids")


# ------------------------------------------------------------------ tools


@tool(safety=READ)
def find_order(order_id: str) -> OrderRecord:
    """Fetch an order by its number."""
    record = ORDERS.get(order_id)
    if record is None:
        raise LookupError(f"no order {order_id}")
    return OrderRecord(order_id=order_id, **record)


@tool(safety=ToolSafetyContract(SideEffectLevel.READ, open_world=True))
def track_parcel(carrier: str, tracking_code: str) -> Tracking:
    """Ask the carrier where a parcel is."""
    if not tracking_code:
        return Tracking(eta="not shipped yet", last_scan="none")
    return Tracking(eta="tomorrow", last_scan=f"{carrier}: out for delivery")


@tool(safety=PURE)
def summarise_order(order_id: str, status: str, eta: str) -> dict:
    """One line for the customer."""
    return {"summary": f"Order {order_id} is {status}; delivery: {eta}."}


@tool(safety=READ)
def search_help_articles(query: str, product_area: ProductArea = "any",
                         limit: int = 3) -> Articles:
    """Search the help centre."""
    words = query.lower().split()
    found = [a for a in ARTICLES
             if (product_area in ("any", a["area"]))
             and any(w in a["title"].lower() or w == a["area"] for w in words)]
    return Articles(articles=[a["title"] for a in found[:limit]],
                    article_ids=[a["id"] for a in found[:limit]])


@tool(safety=PURE)
def convert_price(amount_cents: int, from_currency: str, to_currency: str) -> dict:
    """Convert an amount between currencies at today's rate."""
    eur = amount_cents / EUR_RATES[from_currency]
    return {"converted_cents": round(eur * EUR_RATES[to_currency]),
            "to_currency": to_currency}


@tool(safety=ToolSafetyContract(SideEffectLevel.WRITE, requires_approval=True,
                                approval_reason="moves money back to the customer"))
def issue_refund(order_id: str, total_cents: int, reason: str) -> dict:
    """Refund an order in full."""
    return {"refund_id": f"R-{order_id}", "refunded_cents": total_cents, "reason": reason}


@tool(safety=READ)
def churn_signals(customer_id: str) -> dict:
    """Signals that a customer may leave (draft analytics)."""
    orders = [o for o in ORDERS.values() if o["customer_id"] == customer_id]
    return {"orders": len(orders), "risk": "low" if len(orders) > 1 else "medium"}


@tool  # an old integration nobody has reviewed: it declares no safety contract
def legacy_ticket_lookup(ticket_id: str) -> dict:
    """Look a ticket up in the old helpdesk."""
    return {"ticket_id": ticket_id, "state": "closed"}
