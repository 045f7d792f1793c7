"""Server start does not grow with the catalogue: connecting builds no component.

FastMCP asks every provider for its task-capable components when a server starts
(``Provider.get_tasks``); the default answer builds every tool, resource and prompt.
FlowProvider answers from the exposure snapshot instead. These tests count the
components FlowProvider has built (``components_built``), never timings.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from fastmcp import Client
from pydantic import BaseModel

from chainweaver import (
    DefinitionError,
    ExposureConfigError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    Tool,
    ToolSafetyContract,
    merge_safety_contracts,
)
from chainweaver.mcp import ExposurePolicy, FlowServer, ServingConfig
from chainweaver.mcp.components.provider import FlowProvider
from chainweaver.mcp.publish.contract import build_contract
from chainweaver.mcp.publish.exposure import Exposure

FLOWS = 300


class Text(BaseModel):
    text: str


class Words(BaseModel):
    words: int


def count(data: Text) -> Words:
    return Words(words=len(data.text.split()))


def catalogue(flows: int = FLOWS) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(Tool("count", "Count words.", Text, Words, count,
                                ToolSafetyContract(SideEffectLevel.NONE)))
    for index in range(flows):
        executor.registry.register_flow(
            Flow(f"count_{index:04d}", f"Count words (variant {index}).", [FlowStep("count")]))
    return executor


def provider_of(server: FlowServer) -> FlowProvider:
    (provider,) = [p for p in server.fastmcp.providers if isinstance(p, FlowProvider)]
    return provider


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_connecting_builds_no_component(mode: str) -> None:
    server = FlowServer(catalogue(), expose_schemas=True, expose_prompts=True)
    provider = provider_of(server)
    assert provider.components_built == 0
    async with Client(server.fastmcp, mode=mode) as client:  # type: ignore[arg-type]
        assert provider.components_built == 0
        # A lookup builds the one component it needs, nothing else. (Not a tool call:
        # the client sends tools/list before it, to check the result's schema.)
        await client.read_resource("chainweaver://flows/count_0007/schema")
        assert provider.components_built == 1
        await client.get_prompt("count_0007", {"text": "a b c"})
        assert provider.components_built == 2
        # The counter does see building: a list builds every tool.
        assert len(await client.list_tools()) == FLOWS
        assert provider.components_built == FLOWS + 2


@pytest.mark.anyio
async def test_no_component_is_task_capable_today() -> None:
    server = FlowServer(catalogue(), expose_schemas=True, expose_prompts=True)
    provider = provider_of(server)
    assert provider.task_tool_names() == []
    assert list(await provider.get_tasks()) == []
    assert list(await server.fastmcp.get_tasks()) == []
    assert provider.components_built == 0


def test_flows_with_the_same_models_share_one_contract() -> None:
    executor = catalogue(3)
    contracts = {id(build_contract(executor, executor.registry.get_flow(name)))
                 for name in executor.registry.flow_names()}
    assert len(contracts) == 1


@pytest.mark.parametrize("enabled", [True, False])
def test_the_exposure_decision_restores_the_collector_state(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        Exposure(catalogue(3), ExposurePolicy()).catalogue  # noqa: B018 - decide every flow
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Give back what a test froze: the freeze is process-wide."""
    yield
    gc.unfreeze()


def test_freeze_gc_is_off_by_default(unfrozen: None) -> None:
    assert ServingConfig().freeze_gc is False
    gc.unfreeze()
    FlowServer(catalogue(10))
    assert gc.get_freeze_count() == 0


def test_freeze_gc_freezes_the_heap_once_the_server_is_built(unfrozen: None) -> None:
    gc.unfreeze()
    server = FlowServer(catalogue(10), serving=ServingConfig(freeze_gc=True))
    assert gc.get_freeze_count() > 0
    # Frozen objects sit outside the collector's generations.
    assert all(obj is not server.executor for obj in gc.get_objects())


def test_freeze_gc_must_be_a_bool() -> None:
    with pytest.raises(ExposureConfigError, match="freeze_gc must be True or False"):
        ServingConfig(freeze_gc=1)  # type: ignore[arg-type]


def test_flows_with_the_same_tools_share_one_merged_safety_contract() -> None:
    executor = catalogue(3)
    flows = [executor.registry.get_flow(name) for name in executor.registry.flow_names()]
    merged = {id(executor.effective_safety(flow)) for flow in flows}
    assert len(merged) == 1
    assert executor.effective_safety(flows[0]) == ToolSafetyContract(SideEffectLevel.NONE)


def test_a_contract_that_cannot_be_hashed_still_merges() -> None:
    # The constructor refuses such a field (tests/core/test_definition_messages.py);
    # a contract changed past it (a subclass, a frozen field forced) still merges.
    with pytest.raises(DefinitionError):
        ToolSafetyContract(SideEffectLevel.READ, idempotent=[True])  # type: ignore[arg-type]
    odd = ToolSafetyContract(SideEffectLevel.READ)
    object.__setattr__(odd, "idempotent", [True])
    merged = merge_safety_contracts([odd, ToolSafetyContract(SideEffectLevel.NONE)])
    assert merged == ToolSafetyContract(SideEffectLevel.READ, idempotent=True)


@pytest.mark.anyio
async def test_lists_compile_no_plan_and_a_call_compiles_its_own_once() -> None:
    executor = catalogue()
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        serving=ServingConfig(page_size=50))
    async with Client(server.fastmcp) as client:
        assert len((await client.list_tools_mcp()).tools) == 50
        await client.list_resources_mcp()
        await client.list_prompts_mcp()
        assert len(server.exposure_report()) == FLOWS
        assert executor.plans_compiled == 0  # every flow decided, no plan compiled
        for _ in range(2):
            result = await client.call_tool("count_0007", {"text": "a b c"})
            assert result.structured_content == {"words": 3}
        assert executor.plans_compiled == 1


@pytest.mark.parametrize("approval", [None, "elicit"])
def test_the_decision_without_plans_answers_exactly_as_with_them(
        monkeypatch: pytest.MonkeyPatch, approval: str | None) -> None:
    class Other(BaseModel):
        other: int

    executor = catalogue(3)
    executor.register_tool(Tool("other", "Needs another field.", Other, Words,
                                lambda data: Words(words=data.other),
                                ToolSafetyContract(SideEffectLevel.NONE)))
    executor.register_tool(Tool("erase", "Erase.", Text, Words, count,
                                ToolSafetyContract(SideEffectLevel.DESTRUCTIVE)))
    for flow in [
        Flow("unfed", "", [FlowStep("count"), FlowStep("other")]),
        Flow("renamed", "", [FlowStep("count", {"text": "body"}), FlowStep("other",
                                                                           {"other": "words"})]),
        Flow("ghost", "", [FlowStep("count"), FlowStep("nothing")]),
        Flow("erasing", "", [FlowStep("count"), FlowStep("erase", {"text": "words"})]),
        Flow("nested", "", [FlowStep(flow="count_0001")]),
        Flow("bad_output", "", [FlowStep("count", output_mapping={"n": "nope"})]),
    ]:
        executor.registry.register_flow(flow)

    def report() -> list[dict]:
        policy = ExposurePolicy(approval=approval) if approval else ExposurePolicy()
        server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                            policy=policy)
        return [line.to_dict() for line in server.exposure_report()]

    quick = report()
    # The flows shown clean compiled none, approval asked for or not (their approval
    # is read from their tools).
    assert executor.plans_compiled == 5
    monkeypatch.setattr(FlowExecutor, "clean_input_model", lambda self, flow: None)
    assert report() == quick
    assert [line["exposed"] for line in quick].count(False) >= 4
