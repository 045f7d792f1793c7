"""The step-grant property, through a real MCP client: 20 callers with random scopes,
random flows (sub-flows, fallbacks, conditional steps, retries, delegations).

- No call executes a tool the caller could not call directly, unless a delegation the
  flow (or one of its sub-flows) declares covers it.
- Every caller's view (tools/list) is exactly the flows an independent oracle says it
  holds every grant of, and every flow in the view runs to completion for it.
"""

from __future__ import annotations

import random

import pytest
from fastmcp import Client

from chainweaver import (
    Delegation,
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    RetryPolicy,
    Tool,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import CallerIdentity, FlowServer, GateContext, SecurityConfig
from chainweaver.mcp.gate import admission

pytestmark = pytest.mark.anyio
SCOPES = [f"s{i}" for i in range(5)]
READ = ToolSafetyContract("read")
EXECUTED: list[tuple[str, str]] = []  # (caller id, tool name), as the tools saw it


def make_tool(name: str, requires: list[str], fails: bool) -> Tool:
    async def run(x: int) -> dict[str, int]:
        EXECUTED.append((admission.caller().id, name))
        if fails:
            raise RuntimeError("always fails")
        return {"x": x + 1}

    return tool(name=name, safety=READ, requires=requires or None)(run)


def catalogue(rng: random.Random) -> tuple[FlowExecutor, dict[str, Tool], list[Flow]]:
    tools = {}
    for index in range(6):
        name = f"t{index}"
        tools[name] = make_tool(name, rng.sample(SCOPES, rng.choice([0, 0, 1, 1, 2])),
                                False)
    tools["broken"] = make_tool("broken", [], True)
    executor = FlowExecutor(FlowRegistry())
    for item in tools.values():
        executor.register_tool(item)
    working = [name for name in tools if name != "broken"]
    flows: list[Flow] = []
    for index in range(10):
        steps = []
        count = rng.randint(1, 4)
        for position in range(count):
            step_id = f"s{position}"
            # The last step gives the flow's output: never a skipped branch.
            kind = rng.random() if position < count - 1 else 0.5 + rng.random() / 2
            subflows = [f for f in flows if f.name != f"f{index}"]
            if kind < 0.25 and subflows:
                steps.append(FlowStep(flow=rng.choice(subflows).name, id=step_id))
            elif kind < 0.45:
                steps.append(FlowStep("broken", id=step_id, on_error="fallback",
                                      fallback=rng.choice(working)))
            elif 0.45 <= kind < 0.6 and position < count - 1:
                # A branch never taken: its grant still counts for the view.
                steps.append(FlowStep(rng.choice(working), id=step_id, when="x < -1000"))
            elif kind < 0.75:
                steps.append(FlowStep(rng.choice(working), id=step_id,
                                      retry=RetryPolicy(max_attempts=2, backoff_seconds=0)))
            else:
                steps.append(FlowStep(rng.choice(working), id=step_id))
        delegations = []
        if rng.random() < 0.3:
            step = rng.choice(steps)
            delegations.append(Delegation(step.id or step.name, "a service chore"))
        flow = Flow(f"f{index}", "random", steps, delegations=delegations,
                    governance=FlowGovernance(publish=rng.random() < 0.7))
        executor.registry.register_flow(flow)
        flows.append(flow)
    # One flow that surely runs a guarded tool on a delegation.
    guarded = next(name for name, item in tools.items() if item.requires is not None)
    flow = Flow("delegating", "runs a guarded tool as the service",
                [FlowStep(working[0], id="first"), FlowStep(guarded, id="chore")],
                delegations=[Delegation("chore", "a service chore")])
    executor.registry.register_flow(flow)
    flows.append(flow)
    return executor, tools, flows


def required(flow: Flow, flows: dict[str, Flow], tools: dict[str, Tool]) -> set[str]:
    """The oracle: every scope a run of ``flow`` may need, delegated steps aside."""
    delegated = {d.step for d in flow.delegations}
    needed: set[str] = set()
    for step, step_id in zip(flow.steps, flow.step_ids, strict=True):
        if step_id in delegated:
            continue
        if step.flow is not None:
            needed |= required(flows[step.flow], flows, tools)
        else:
            needed |= tools[step.name].requires.scopes if tools[step.name].requires else set()
        if step.fallback is not None and tools[step.fallback].requires is not None:
            needed |= tools[step.fallback].requires.scopes  # type: ignore[union-attr]
    return needed


def delegated_tools(flow: Flow, flows: dict[str, Flow]) -> set[str]:
    """The oracle: tools a run of ``flow`` may run on a delegation."""
    delegated = {d.step for d in flow.delegations}
    found: set[str] = set()
    for step, step_id in zip(flow.steps, flow.step_ids, strict=True):
        if step.flow is not None:
            inner = flows[step.flow]
            found |= all_tools(inner, flows) if step_id in delegated \
                else delegated_tools(inner, flows)
        elif step_id in delegated:
            found |= {step.name} | ({step.fallback} if step.fallback else set())
    return found


def all_tools(flow: Flow, flows: dict[str, Flow]) -> set[str]:
    found: set[str] = set()
    for step in flow.steps:
        if step.flow is not None:
            found |= all_tools(flows[step.flow], flows)
        else:
            found |= {step.name} | ({step.fallback} if step.fallback else set())
    return found


# One catalogue in the fast lane; more in the slow one.
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow)])
async def test_no_step_beyond_the_caller_and_views_equal_what_runs(seed: int) -> None:
    rng = random.Random(seed)
    executor, tools, flow_list = catalogue(rng)
    flows = {flow.name: flow for flow in flow_list}
    callers = {f"c{i}": frozenset(rng.sample(SCOPES, rng.randint(0, len(SCOPES))))
               for i in range(20)}
    current = {"id": "c0"}

    def authenticate(ctx: GateContext) -> CallerIdentity:
        return CallerIdentity(current["id"], scopes=callers[current["id"]])

    server = FlowServer(executor, security=SecurityConfig(authenticator=authenticate))
    published = {e.flow_name for e in server.exposure_report() if e.exposed}
    assert published, "the catalogue publishes something"
    checked_delegation = False
    EXECUTED.clear()
    async with Client(server.fastmcp) as client:
        for caller_id, scopes in callers.items():
            current["id"] = caller_id
            view = {t.name for t in await client.list_tools()}
            oracle = {name for name in published
                      if required(flows[name], flows, tools) <= scopes}
            assert view == oracle, caller_id
            completed = set()
            for name in sorted(published):
                EXECUTED.clear()
                result = await client.call_tool(name, {"x": 1}, raise_on_error=False)
                if not result.is_error:
                    completed.add(name)
                direct = {t for t, item in tools.items()
                          if item.requires is None or item.requires.scopes <= scopes}
                allowed = direct | delegated_tools(flows[name], flows)
                ran = {tool_name for who, tool_name in EXECUTED if who == caller_id}
                assert ran <= allowed, (caller_id, name, ran - allowed)
                checked_delegation |= bool(ran - direct)
            assert completed == view, caller_id
    assert checked_delegation, "a caller ran a tool beyond its grants on a delegation"
