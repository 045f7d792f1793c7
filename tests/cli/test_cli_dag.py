"""`chainweaver schema`, `chainweaver inspect --graph`, and flows excluded by the static
data-flow check in `chainweaver inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from support.cli import run

pytestmark = pytest.mark.usefixtures("in_repository")

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "examples/flow_tools.py"

DAG_FLOW = {
    "name": "order_overview",
    "description": "Track the parcel and convert the total at once, then summarise.",
    "input_schema": {"type": "object", "properties": {
        "order_id": {"type": "string"}, "to_currency": {"type": "string"}},
        "required": ["order_id", "to_currency"]},
    "steps": [
        {"tool": "find_order"},
        {"tool": "track_parcel", "after": ["find_order"], "when": "status != 'processing'",
         "timeout": 5},
        {"tool": "convert_price", "after": ["find_order"],
         "input_mapping": {"amount_cents": "total_cents", "from_currency": "currency"}},
        {"tool": "summarise_order", "after": ["track_parcel", "convert_price"],
         "on_error": "skip"},
    ],
}
BROKEN_FLOW = {
    "name": "broken_overview",
    "description": "Needs a field nothing provides.",
    "steps": [{"tool": "find_order"},
              {"tool": "convert_price", "input_mapping": {"amount_cents": "total_cents"}}],
}


def write(tmp_path: Path, *flows: dict) -> str:
    for flow in flows:
        (tmp_path / f"{flow['name']}.flow.json").write_text(json.dumps(flow))
    return str(tmp_path)


def test_schema_prints_the_flow_file_json_schema(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "schema")
    assert code == 0 and err == ""
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(DAG_FLOW)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**DAG_FLOW, "steps": [{"tool": "x", "on_error": "ignore"}]})


def test_inspect_graph_prints_mermaid(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code, out, err = run(capsys, "inspect", write(tmp_path, DAG_FLOW), "--tools", TOOLS,
                         "--graph", "order_overview")
    assert code == 0, err
    assert out.splitlines() == [
        "flowchart TD",
        '    n0["find_order"]',
        "    n1{{\"track_parcel<br/>when: status != 'processing'<br/>timeout: 5 s\"}}",
        '    n2["convert_price"]',
        '    n3["summarise_order<br/>on_error: skip"]',
        "    n0 --> n1",
        "    n0 --> n2",
        "    n1 --> n3",
        "    n2 --> n3",
    ]
    code, out, err = run(capsys, "inspect", write(tmp_path, DAG_FLOW), "--tools", TOOLS,
                         "--graph", "nope")
    assert code == 1 and "no flow named 'nope'" in err


def test_inspect_shows_flows_the_data_flow_check_excludes(
        capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code, out, err = run(capsys, "inspect", write(tmp_path, DAG_FLOW, BROKEN_FLOW),
                         "--tools", TOOLS, "--json")
    assert code == 0, err
    report = {entry["flow_name"]: entry for entry in json.loads(out)["flows"]}
    assert report["order_overview"]["exposed"] is True
    broken = report["broken_overview"]
    assert broken["exposed"] is False
    assert "step 1 ('convert_price')" in broken["reason"]
    assert "'to_currency'" in broken["reason"]
