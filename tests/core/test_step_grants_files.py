"""Step grants and delegations in flow files: the reader and the JSON Schema editors
validate with agree, and every mistake names its field."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from chainweaver import Delegation, FlowFileError, Grants
from chainweaver.flow_data import flow_from_data
from chainweaver.flow_format import flow_file_schema

VALIDATOR = jsonschema.Draft202012Validator(flow_file_schema())


def guarded(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "guarded", "description": "d", "requires": ["records.read"],
        "steps": [{"tool": "read_record", "requires": {"claims": {"tenant": ["a", "b"]}}},
                  "summarise"],
        "delegations": [{"step": "summarise", "reason": "summaries are public"}],
    }
    data.update(changes)
    return data


def test_a_flow_file_declares_grants_and_delegations() -> None:
    data = guarded()
    assert not list(VALIDATOR.iter_errors(data))
    flow = flow_from_data(data)
    assert flow.requires == Grants(frozenset({"records.read"}))
    assert flow.steps[0].requires == Grants(claims={"tenant": ["a", "b"]})
    assert flow.delegations == (Delegation("summarise", "summaries are public"),)
    scoped = flow_from_data(guarded(requires={"scopes": ["x"], "claims": {"team": "ops"}}))
    assert scoped.requires == Grants(frozenset({"x"}), {"team": ["ops"]})


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"requires": "records.read"}, "requires", "list of scopes or a mapping"),
    ({"requires": {"scope": ["x"]}}, "requires.scope", "did you mean 'scopes'"),
    ({"requires": {"claims": {"tenant": []}}}, "requires", "no accepted value"),
    ({"requires": [""]}, "requires", "scope"),
    ({"delegations": [{"step": "summarise"}]}, "delegations[0]", "reason"),
    ({"delegations": [{"step": "summarise", "reason": "r", "why": "x"}]},
     "delegations[0].why", "unknown key"),
    ({"delegations": [{"step": "nope", "reason": "r"}]}, "", "does not have"),
])
def test_a_mistake_is_a_file_error_and_a_schema_error(changes: dict[str, Any], field: str,
                                                     words: str) -> None:
    data = guarded(**changes)
    with pytest.raises(FlowFileError) as raised:
        flow_from_data(data)
    assert field in str(raised.value) and words in str(raised.value)
    if changes.get("delegations", [{}])[0].get("step") != "nope":  # ids: the reader's
        assert list(VALIDATOR.iter_errors(data))


def test_a_step_requires_mistake_names_the_step() -> None:
    data = guarded(steps=[{"tool": "read_record", "requires": {"claims": {"t": 1}}}])
    with pytest.raises(FlowFileError, match=r"steps\[0\]\.requires"):
        flow_from_data(data)
    assert list(VALIDATOR.iter_errors(data))


def test_a_step_id_holding_a_slash_is_refused_by_the_reader_and_the_schema() -> None:
    # "/" separates a sub-flow step's id from its steps' in paths: an id holding one
    # would pass for a path, and a delegation of "summarise" would cover it.
    data = guarded(steps=["summarise", {"tool": "read_record", "id": "summarise/all"}])
    with pytest.raises(FlowFileError, match=r"steps\[1\].*'/'"):
        flow_from_data(data)
    assert list(VALIDATOR.iter_errors(data))
