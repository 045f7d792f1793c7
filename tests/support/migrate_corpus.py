"""The tools and models the reference-format flows in tests/cli/migrate_corpus use.

Plain models and functions (``fn(validated_input) -> dict``), so the same definitions
serve ChainWeaver (:func:`chainweaver_tools`) and, when the corpus's expected results
were recorded, the reference package. The corpus files name the models as
``support.migrate_corpus:ModelName`` (``tests`` is on the path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

CALLS: dict[str, int] = {}  # shipping fails the first time it is asked for each city


class OrderRequest(BaseModel):
    order_id: str
    currency: str = "EUR"


class CaseRequest(BaseModel):
    case_id: str
    amount: int


class RouteSummary(BaseModel):
    summary: str
    order_id: str


class OrderId(BaseModel):
    order_id: str


class Order(BaseModel):
    order: dict[str, Any]


class ShippingIn(BaseModel):
    city: str
    weight: int
    express: bool


class Shipping(BaseModel):
    shipping: int


class AddIn(BaseModel):
    value: int
    amount: int


class Value(BaseModel):
    value: int


class Amount(BaseModel):
    amount: int


class Discounted(BaseModel):
    discounted: int


class Nothing(BaseModel):
    pass


class LabelIn(BaseModel):
    amount: int
    currency: str
    first_sku: str


class Label(BaseModel):
    label: str


class Probe(BaseModel):
    cache_hit: bool
    size: int


class Eta(BaseModel):
    eta_fast: int | None = None
    eta_bulk: int | None = None
    eta_slow: int | None = None


class FastEta(BaseModel):
    eta_fast: int


class BulkEta(BaseModel):
    eta_bulk: int


class SlowEta(BaseModel):
    eta_slow: int


class Notified(BaseModel):
    notified: int


class Summary(BaseModel):
    summary: str


class RefundIn(BaseModel):
    amount: int
    priority: int
    notify: bool


class Refund(BaseModel):
    refunded: int


class Logged(BaseModel):
    logged: bool


class Done(BaseModel):
    refunded: int = 0
    logged: bool = False


class Closed(BaseModel):
    closed: str


class TagsIn(BaseModel):
    label: str
    tags: list[str]
    options: dict[str, Any]


class Tagged(BaseModel):
    tagged: str


ORDERS = {"o-1": {"customer": {"name": "Ada", "address": {"city": "Porto"}}, "total": 20,
                  "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}}


def lookup_order(inp: OrderId) -> dict:
    return {"order": ORDERS[inp.order_id]}


def shipping(inp: ShippingIn) -> dict:
    CALLS[inp.city] = CALLS.get(inp.city, 0) + 1
    if CALLS[inp.city] == 1:
        raise ConnectionError("rate service busy")
    return {"shipping": inp.weight + (4 if inp.express else 2)}


def add(inp: AddIn) -> dict:
    return {"value": inp.value + inp.amount}


def discount(inp: Amount) -> dict:
    raise RuntimeError("discount service down")


def no_discount(inp: Amount) -> dict:
    return {"discounted": inp.amount}


def audit(inp: OrderId) -> dict:
    raise RuntimeError("audit log unavailable")


def format_label(inp: LabelIn) -> dict:
    return {"label": f"{inp.currency} {inp.amount} ({inp.first_sku})"}


def probe(inp: OrderId) -> dict:
    return {"cache_hit": inp.order_id.startswith("hit"), "size": len(inp.order_id) * 4}


def fast(inp: OrderId) -> dict:
    return {"eta_fast": 1}


def bulk(inp: OrderId) -> dict:
    return {"eta_bulk": 5}


def slow(inp: OrderId) -> dict:
    return {"eta_slow": 3}


def notify_bulk(inp: Probe) -> dict:
    return {"notified": inp.size}


def summarize(inp: Eta) -> dict:
    parts = [f"{k}={v}" for k, v in inp.model_dump().items() if v is not None]
    return {"summary": ",".join(parts)}


def refund(inp: RefundIn) -> dict:
    return {"refunded": inp.amount * inp.priority}


def log_case(inp: Amount) -> dict:
    return {"logged": True}


def close_case(inp: Done) -> dict:
    return {"closed": f"refunded={inp.refunded} logged={inp.logged}"}


def tag(inp: TagsIn) -> dict:
    return {"tagged": f"{inp.label} {'+'.join(inp.tags)} {sorted(inp.options.items())}"}


# name -> (function, input model, output model, side effects)
SPECS: dict[str, tuple[Callable[[Any], dict], type[BaseModel], type[BaseModel], str]] = {
    "lookup_order": (lookup_order, OrderId, Order, "read"),
    "shipping": (shipping, ShippingIn, Shipping, "read"),
    "add": (add, AddIn, Value, "none"),
    "discount": (discount, Amount, Discounted, "read"),
    "no_discount": (no_discount, Amount, Discounted, "none"),
    "audit": (audit, OrderId, Nothing, "read"),
    "format_label": (format_label, LabelIn, Label, "none"),
    "probe": (probe, OrderId, Probe, "read"),
    "fast": (fast, OrderId, FastEta, "read"),
    "bulk": (bulk, OrderId, BulkEta, "read"),
    "slow": (slow, OrderId, SlowEta, "read"),
    "notify_bulk": (notify_bulk, Probe, Notified, "read"),
    "summarize": (summarize, Eta, Summary, "none"),
    "refund": (refund, RefundIn, Refund, "read"),
    "log_case": (log_case, Amount, Logged, "read"),
    "close_case": (close_case, Done, Closed, "none"),
    "tag": (tag, TagsIn, Tagged, "none"),
}


def chainweaver_tools() -> list[Any]:
    """The tools as ChainWeaver ``Tool`` values."""
    from chainweaver import Tool, ToolSafetyContract

    return [Tool(name, f"The corpus's {name}.", inp, out, fn, ToolSafetyContract(effects))
            for name, (fn, inp, out, effects) in SPECS.items()]
