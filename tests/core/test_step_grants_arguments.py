"""The step authorizer decides on the arguments a tool actually runs with: its input
model's defaults filled in and its validators applied, in both lanes, for a step, its
retries and its fallback; a refusal still comes before anything the input says."""

from __future__ import annotations

import asyncio
import posixpath
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel

from chainweaver import (
    Caller,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    StepDecision,
    StepRequest,
    ToolSafetyContract,
    tool,
)

READ = ToolSafetyContract("read")
RAN: list[str] = []
LANES = ["sync", "async"]
ANN = Caller("ann", {"records.read"}, {"tenant": "a"})


class Opened(BaseModel):
    account: str


class Record(BaseModel):
    record: str


@tool(safety=READ)
def open_account(account: str) -> Opened:
    return Opened(account=account)


@tool(safety=READ, requires=["records.read"])
def read_record(account: str, tenant: str = "root") -> Record:
    RAN.append(f"read:{tenant}")
    return Record(record=f"{account} of {tenant}")


def normalised(path: str) -> str:
    return posixpath.normpath(path)


class Located(BaseModel):
    path: str


@tool(safety=READ)
def locate(path: str) -> Located:
    return Located(path=path)  # as given: the next tool's input model normalises it


@tool(safety=READ, requires=["records.read"])
def read_file(path: Annotated[str, AfterValidator(normalised)]) -> Record:
    RAN.append(f"file:{path}")
    return Record(record=path)


@tool(safety=READ)
def broken(account: str) -> Record:
    raise RuntimeError("down")


@tool(safety=READ, requires=["records.read"])
def fallback_record(account: str, tenant: str = "root") -> Record:
    RAN.append(f"fallback:{tenant}")
    return Record(record=tenant)


@tool(safety=READ, requires=["records.admin"])
def admin_count(count: int) -> Record:
    RAN.append("admin_count")
    return Record(record=str(count))


def own_tenant(request: StepRequest) -> StepDecision:
    """Steps that name a tenant or a path must stay in the caller's own tenant."""
    tenant = request.caller.claims.get("tenant")
    arguments = request.arguments
    if "tenant" in arguments:
        return StepDecision(arguments["tenant"] == tenant, "other_tenant")
    if "path" in arguments:
        return StepDecision(arguments["path"].startswith(f"/tenants/{tenant}/"),
                            "other_tenant")
    return StepDecision(True)


def runner(*flows: Flow) -> FlowExecutor:
    RAN.clear()
    executor = FlowExecutor(FlowRegistry(), step_authorizer=own_tenant)
    for item in (open_account, read_record, locate, read_file, broken, fallback_record,
                 admin_count):
        executor.register_tool(item)
    for flow in flows:
        executor.registry.register_flow(flow)
    return executor


def run(executor: FlowExecutor, name: str, input: dict[str, Any], lane: str) -> Any:
    if lane == "sync":
        return executor.execute_flow(name, input, caller=ANN)
    return asyncio.run(executor.execute_flow_async(name, input, caller=ANN))


@pytest.mark.parametrize("lane", LANES)
def test_a_default_the_tool_fills_in_is_what_the_authorizer_sees(lane: str) -> None:
    executor = runner(Flow("lookup", "d", [FlowStep("open_account"),
                                           FlowStep("read_record")]))
    result = run(executor, "lookup", {"account": "x"}, lane)
    # The tool would have read tenant "root"'s record: the hook is asked about that.
    assert result.error is not None and result.error.type == "StepRefused"
    assert result.error.detail == "other_tenant" and RAN == []


@pytest.mark.parametrize("lane", LANES)
def test_a_value_the_input_model_normalises_is_decided_as_normalised(lane: str) -> None:
    executor = runner(Flow("files", "d", [FlowStep("locate"), FlowStep("read_file")]))
    sneaky = run(executor, "files", {"path": "/tenants/a/../b/secret"}, lane)
    assert sneaky.error is not None and sneaky.error.detail == "other_tenant"
    assert RAN == []
    assert run(executor, "files", {"path": "/tenants/a/./notes"}, lane).success
    assert RAN == ["file:/tenants/a/notes"]


@pytest.mark.parametrize("lane", LANES)
def test_a_fallback_is_decided_on_its_own_resolved_arguments(lane: str) -> None:
    executor = runner(Flow("risky", "d", [
        FlowStep("open_account"),
        FlowStep("broken", on_error="fallback", fallback="fallback_record")]))
    result = run(executor, "risky", {"account": "x"}, lane)
    assert result.error is not None and result.error.type == "StepRefused"
    assert result.error.detail == "other_tenant" and RAN == []


@pytest.mark.parametrize("lane", LANES)
def test_a_refusal_still_comes_before_an_input_error(lane: str) -> None:
    # The caller lacks the step's grant: it is told so, not what the tool's input
    # validation thinks of the value (which could say things about the data).
    executor = runner(Flow("counting", "d", [FlowStep("open_account", id="first"),
                                             FlowStep("admin_count",
                                                      input_mapping={"count": "account"})]))
    result = run(executor, "counting", {"account": "not a number"}, lane)
    assert result.error is not None and result.error.type == "StepRefused"
    assert result.error.detail == "missing_grant" and RAN == []
