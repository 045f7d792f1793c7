"""Definition-time mistakes a flow author makes in Python say what to write instead:
the allowed values of a safety level or lifecycle, the right type of a contract's
flags, and which step of a list is not a ``FlowStep``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from chainweaver import (
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)


def test_an_unknown_side_effect_level_lists_the_levels() -> None:
    with pytest.raises(DefinitionError) as caught:
        ToolSafetyContract("reads")  # type: ignore[arg-type]
    assert str(caught.value) == ("side_effects must be one of none, read, write, external, "
                                 "destructive, got 'reads'")
    assert isinstance(caught.value, ValueError)  # what it raised before stays catchable


@pytest.mark.parametrize("field, value, expected", [
    ("idempotent", "yes", "idempotent must be True, False or None, got 'yes'"),
    ("requires_approval", "no", "requires_approval must be True or False, got 'no'"),
    ("open_world", 1, "open_world must be True or False, got 1"),
    ("approval_reason", 5, "approval_reason must be a string or None, got 5"),
])
def test_a_contract_flag_of_the_wrong_type_is_refused(field: str, value: object,
                                                      expected: str) -> None:
    # "no" is truthy: taken as it was, it would require approval.
    with pytest.raises(DefinitionError, match=f"^{expected}$"):
        ToolSafetyContract("read", **{field: value})  # type: ignore[arg-type]


def test_an_unknown_lifecycle_lists_the_lifecycles() -> None:
    allowed = "draft, reviewed, active, archived"
    with pytest.raises(DefinitionError, match=f"^lifecycle must be one of {allowed}, "
                                              "got 'live'$"):
        FlowGovernance("live")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match=f"one of {allowed}, got 'live'$"):
        FlowGovernance().transition("live")
    registry = FlowRegistry()
    registry.register_flow(Flow("f", "d", [FlowStep("t")]))
    with pytest.raises(DefinitionError, match=f"one of {allowed}, got 'live'$"):
        registry.set_lifecycle("f", "live")


def test_a_step_that_is_not_a_flowstep_is_named_with_what_to_write() -> None:
    with pytest.raises(DefinitionError) as caught:
        Flow("f", "d", [FlowStep("a"), "b"])  # type: ignore[list-item]
    assert str(caught.value) == ("flow 'f': steps[1] must be a FlowStep, got str 'b' "
                                 "(write FlowStep('b'))")
    with pytest.raises(DefinitionError, match=r"^flow 'f': steps\[0\] must be a FlowStep, "
                                              r"got dict$"):
        Flow("f", "d", [{"tool": "a"}])  # type: ignore[list-item]


class City(BaseModel):
    city: str


class Forecast(BaseModel):
    high: float


@tool
def get_forecast(query: City) -> Forecast:
    """Forecast."""
    return Forecast(high=20.0)


def test_a_misspelt_tool_or_fallback_says_which_registered_one_was_meant() -> None:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(get_forecast)
    typo = Flow("typo", "d", [FlowStep("get_forcast")])
    fallback = Flow("fallback", "d", [
        FlowStep("get_forecast", on_error="fallback", fallback="get_forecats")])
    far = Flow("far", "d", [FlowStep("unrelated_name")])
    assert executor.check_flow(typo) == [
        "step 0 uses unregistered tool 'get_forcast' (did you mean 'get_forecast'?)"]
    (fallen,) = executor.check_flow(fallback)
    assert fallen.endswith("falls back to unregistered tool 'get_forecats' "
                           "(did you mean 'get_forecast'?)")
    assert executor.check_flow(far) == ["step 0 uses unregistered tool 'unrelated_name'"]
    executor.registry.register_flow(typo)
    failed = executor.execute_flow("typo", {"city": "Oslo"}).error
    assert failed is not None and failed.message == executor.check_flow(typo)[0]
