"""An executor that keeps what each run was handed, and the tool it runs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool


class Text(BaseModel):
    text: str


class Words(BaseModel):
    words: int


@tool(safety=ToolSafetyContract("none", idempotent=True))
def count(value: Text) -> Words:
    return Words(words=len(value.text.split()))


class Watched(FlowExecutor):
    """An executor that keeps what each run was handed (the public keywords)."""

    def __init__(self) -> None:
        super().__init__(FlowRegistry())
        self.register_tool(count)
        self.registry.register_flow(Flow("count_words", "Count words.", [FlowStep("count")]))
        self.handed: list[dict[str, Any]] = []

    async def execute_flow_async(self, name: str, input: Any, version: str | None = None,
                                 **keywords: Any) -> Any:
        self.handed.append(keywords)
        return await super().execute_flow_async(name, input, version, **keywords)


def observers(observer: Any) -> list[type]:
    """The types of the observers a run was handed (a fan-out opened up)."""
    if observer is None:
        return []
    return [type(o) for o in getattr(observer, "observers", (observer,))]


