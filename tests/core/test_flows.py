"""Flow definitions: lifecycle, governance, steps, names and versions."""

from __future__ import annotations

import dataclasses
from itertools import product

import pytest
from pydantic import BaseModel

from chainweaver import (
    ChainWeaverError,
    DefinitionError,
    Flow,
    FlowGovernance,
    FlowLifecycle,
    FlowPrompt,
    FlowStep,
    InvalidNameError,
    InvalidVersionError,
    LifecycleTransitionError,
    PromptDefinitionError,
    PromptMessage,
    ToolSafetyContract,
)

D, R, A, X = (FlowLifecycle.DRAFT, FlowLifecycle.REVIEWED, FlowLifecycle.ACTIVE,
              FlowLifecycle.ARCHIVED)
ALLOWED = {(D, R), (D, X), (R, D), (R, A), (R, X), (A, X)}


def step() -> list[FlowStep]:
    return [FlowStep("t")]


# ----------------------------------------------------------------- lifecycle


def test_lifecycle_values() -> None:
    assert [s.value for s in FlowLifecycle] == ["draft", "reviewed", "active", "archived"]
    assert str(FlowLifecycle.REVIEWED) == "reviewed"


@pytest.mark.parametrize(("source", "target"), sorted(ALLOWED, key=str))
def test_allowed_transitions_return_a_new_value(source, target) -> None:
    governance = FlowGovernance(source, owner="team-a")
    moved = governance.transition(target)
    assert moved.lifecycle is target
    assert moved.owner == "team-a"
    assert governance.lifecycle is source  # the original is unchanged
    assert moved is not governance


@pytest.mark.parametrize(
    ("source", "target"),
    [pair for pair in product(FlowLifecycle, repeat=2) if pair not in ALLOWED],
)
def test_disallowed_transitions_raise(source, target) -> None:
    with pytest.raises(LifecycleTransitionError, match=f"{source.value!r} to {target.value!r}"):
        FlowGovernance(source).transition(target)


def test_transition_error_lists_what_is_allowed() -> None:
    with pytest.raises(LifecycleTransitionError, match=r"allowed: archived\)"):
        FlowGovernance(A).transition(D)
    with pytest.raises(LifecycleTransitionError, match=r"allowed: none\)"):
        FlowGovernance(X).transition(A)
    assert issubclass(LifecycleTransitionError, ChainWeaverError)


def test_governance_accepts_strings_and_defaults_to_active() -> None:
    assert FlowGovernance().lifecycle is A
    assert FlowGovernance().owner is None
    governance = FlowGovernance("draft")
    assert governance.lifecycle is D
    assert governance.transition("reviewed").lifecycle is R
    with pytest.raises(ValueError):
        FlowGovernance("published")  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        governance.lifecycle = A  # type: ignore[misc]


def test_full_review_cycle() -> None:
    governance = FlowGovernance(D)
    for target in (R, D, R, A, X):
        governance = governance.transition(target)
    assert governance.lifecycle is X


# --------------------------------------------------------------------- steps


def test_step_mapping_is_an_immutable_copy() -> None:
    mapping = {"order_id": "id"}
    s = FlowStep("lookup", mapping)
    mapping["other"] = "x"
    assert dict(s.input_mapping) == {"order_id": "id"}
    with pytest.raises(TypeError):
        s.input_mapping["y"] = "z"  # type: ignore[index]
    assert dict(FlowStep("lookup").input_mapping) == {}


def test_step_checks_tool_name_and_mapping_types() -> None:
    with pytest.raises(InvalidNameError):
        FlowStep("bad name")
    with pytest.raises(DefinitionError, match="strings"):
        FlowStep("ok", {"a": 1})  # type: ignore[dict-item]
    with pytest.raises(DefinitionError, match="strings"):
        FlowStep("ok", {1: "a"})  # type: ignore[dict-item]


# --------------------------------------------------------------------- flows


def test_flow_defaults() -> None:
    flow = Flow("order_lookup", "Look up an order.", step())
    assert flow.version == "1.0.0"
    assert flow.title is None
    assert flow.input_schema is None and flow.output_schema is None
    assert flow.governance == FlowGovernance()
    assert flow.safety is None
    assert flow.prompts == ()
    assert isinstance(flow.steps, tuple)


@pytest.mark.parametrize("name", ["a", "x" * 64, "Order.Lookup-2_b"])
def test_valid_flow_names(name: str) -> None:
    assert Flow(name, "", step()).name == name


@pytest.mark.parametrize("name", ["", "x" * 65, "with space", "a/b", "a:b", "é", None])
def test_invalid_flow_names(name) -> None:
    with pytest.raises(InvalidNameError):
        Flow(name, "", step())


@pytest.mark.parametrize(
    "version", ["1.0.0", "1.0", "2", "v1.2.3", "1.0.0-rc.1", "1.0.0+build.5", "1.0rc1",
                "2024.1.post2", "1!2.0", "1.0.dev3", "0.0.1-alpha"],
)
def test_valid_versions(version: str) -> None:
    assert Flow("f", "", step(), version=version).version == version


@pytest.mark.parametrize("version", ["", "  ", "latest", "1.0.0-", "1..0", "one", "1.0b1b2", 1])
def test_invalid_versions(version) -> None:
    with pytest.raises(InvalidVersionError) as caught:
        Flow("f", "", step(), version=version)
    assert isinstance(caught.value, DefinitionError)


def test_flow_definition_checks() -> None:
    with pytest.raises(DefinitionError, match="at least one step"):
        Flow("f", "", [])
    with pytest.raises(DefinitionError, match="FlowStep"):
        Flow("f", "", ["t"])  # type: ignore[list-item]
    with pytest.raises(DefinitionError, match="input_schema"):
        Flow("f", "", step(), input_schema=dict)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="output_schema"):
        Flow("f", "", step(), output_schema="Out")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="governance"):
        Flow("f", "", step(), governance="active")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="safety"):
        Flow("f", "", step(), safety="read")  # type: ignore[arg-type]
    with pytest.raises(PromptDefinitionError, match="FlowPrompt"):
        Flow("f", "", step(), prompts=["hello"])  # type: ignore[list-item]


def test_flow_accepts_models_safety_and_prompts() -> None:
    class In(BaseModel):
        x: int

    prompt = FlowPrompt("ask", messages=[PromptMessage("user", "Run it.")])
    flow = Flow("f", "", iter(step()), input_schema=In, output_schema=In,
                safety=ToolSafetyContract("read"), prompts=[prompt])
    assert flow.prompts == (prompt,)
    assert flow.steps == (FlowStep("t"),)


def test_duplicate_prompt_names_are_rejected() -> None:
    prompt = FlowPrompt("ask", messages=[PromptMessage("user", "Run it.")])
    with pytest.raises(PromptDefinitionError, match="duplicate prompt name"):
        Flow("f", "", step(), prompts=[prompt, prompt])


def test_flow_is_frozen() -> None:
    flow = Flow("f", "", step())
    with pytest.raises(dataclasses.FrozenInstanceError):
        flow.version = "2.0.0"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "title", "expected"),
    [("order_lookup", None, "Order Lookup"), ("order-lookup.v2", None, "Order Lookup V2"),
     ("x", "Custom Title", "Custom Title"), ("__a__b", None, "A B")],
)
def test_display_title(name: str, title, expected: str) -> None:
    assert Flow(name, "", step(), title=title).display_title == expected


def test_version_key_compares_flows_as_versions() -> None:
    def key(version: str) -> tuple:
        return Flow("f", "", step(), version=version).version_key

    assert key("1.10.0") > key("1.9.0")
    assert key("1.0") == key("1.0.0")
