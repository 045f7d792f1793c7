"""Two distinct steps never share an idempotency key: a fallback's key is derived from
its step's id with ``#fallback``, and a hidden sub-flow step is shown as
``subflow#<index>``, so a step id cannot hold ``#`` (in Python, in flow files and in
their JSON Schema), as it cannot hold ``/``."""

from __future__ import annotations

import jsonschema
import pytest

from chainweaver import (
    Caller,
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    IdempotencyKey,
    RetryPolicy,
    StepRequest,
    ToolSafetyContract,
    tool,
)
from chainweaver.errors import FlowFileError
from chainweaver.files import flow_from_data
from chainweaver.flow_format import flow_file_schema

WRITE = ToolSafetyContract("write")


@pytest.mark.parametrize("step_id", ["x#fallback", "subflow#0", "#", "a#b"])
def test_a_step_id_holding_a_hash_is_refused(step_id: str) -> None:
    # "x#fallback" was the key path of step x's fallback: the two steps shared a key.
    with pytest.raises(DefinitionError, match=r"id must not hold .*'#' \(it names a "
                       r"fallback's key and a hidden sub-flow: 'subflow#1'\)"):
        FlowStep("t", id=step_id)


@pytest.mark.parametrize("step_id", ["x#fallback", "subflow#0"])
def test_a_flow_file_step_id_holding_a_hash_is_refused_by_the_reader_and_the_schema(
        step_id: str) -> None:
    data = {"name": "p", "description": "d", "steps": [{"tool": "t", "id": step_id}]}
    with pytest.raises(FlowFileError, match="'#'") as raised:
        flow_from_data(data, "p.flow.json")
    assert raised.value.field == "steps[0]"
    assert not jsonschema.Draft202012Validator(flow_file_schema()).is_valid(data)


def test_every_step_fallback_and_sub_flow_step_of_a_run_has_a_key_of_its_own() -> None:
    keys: list[tuple[str, str]] = []  # (tool, key), as called

    @tool(safety=WRITE)
    def charge(n: int, key: IdempotencyKey) -> dict:
        keys.append(("charge", key))
        raise RuntimeError("declined")

    @tool(safety=WRITE)
    def refund(n: int, key: IdempotencyKey) -> dict:
        keys.append(("refund", key))
        return {"n": n}

    @tool(safety=WRITE)
    def note(n: int, key: IdempotencyKey) -> dict:
        keys.append(("note", key))
        return {"n": n}

    executor = FlowExecutor(FlowRegistry())
    for made in (charge, refund, note):
        executor.register_tool(made)
    executor.registry.register_flow(Flow("inner", "d", [FlowStep("note", id="x")]))
    executor.registry.register_flow(Flow("outer", "d", [
        FlowStep("charge", id="x", on_error="fallback", fallback="refund"),
        FlowStep("note", id="fallback"),
        FlowStep(flow="inner", id="sub")]))
    runs = []
    for _ in range(2):  # the same run twice: the same keys
        keys.clear()
        result = executor.execute_flow("outer", {"n": 1}, run_id="run-1")
        assert result.success, result.error
        runs.append(list(keys))
    assert [name for name, _ in runs[0]] == ["charge", "refund", "note", "note"]
    assert runs[0] == runs[1]
    assert len({key for _, key in runs[0]}) == 4  # step x, its fallback, two others


def test_a_step_falling_back_to_its_own_tool_gives_the_fallback_a_key_of_its_own() -> None:
    # The fallback was told from the step's own call by its tool: the same tool made
    # the first call the fallback's, with the fallback's key and grant check.
    keys: list[str] = []
    kinds: list[tuple[str, int]] = []

    @tool(safety=ToolSafetyContract("write", idempotent=True))
    def charge(n: int, key: IdempotencyKey) -> dict:
        keys.append(key)
        if len(keys) < 3:
            raise ConnectionError("busy")
        return {"n": n}

    def authorizer(request: StepRequest) -> bool:
        kinds.append((request.kind, request.attempt))
        return True

    executor = FlowExecutor(FlowRegistry(), step_authorizer=authorizer)
    executor.register_tool(charge)
    executor.registry.register_flow(Flow("f", "d", [FlowStep(
        "charge", on_error="fallback", fallback="charge",
        retry=RetryPolicy(max_attempts=2, retry_on=("ConnectionError",)))]))
    result = executor.execute_flow("f", {"n": 1}, run_id="run-1", caller=Caller("ann"))
    assert result.success and result.steps[0].fallback == "charge", result.error
    assert keys[0] == keys[1] != keys[2]  # a retry keeps the step's key
    assert kinds == [("tool", 1), ("tool", 2), ("fallback", 3)]
