"""The ``when`` language on list values."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, tool
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
