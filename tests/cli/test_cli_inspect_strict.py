"""`chainweaver inspect --strict` (exit 1 when a flow is excluded as invalid, not when the
policy excludes it) and `inspect --graph FLOW --json` (steps, edges and conditions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run
from support.procs import STARTUP_TIMEOUT

pytestmark = pytest.mark.usefixtures("in_repository")

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "examples/flows"
TOOLS = "examples/flow_tools.py"
CHAINWEAVER = str(Path(sys.executable).parent / "chainweaver")
INVALID = ("name: short\ndescription: S.\nsafety: {side_effects: none}\nsteps:\n"
           "  - find_order\n  - tool: convert_price\n"
           "    input_mapping: {amount_cents: total_cents, from_currency: currency}\n")
DAG = {
    "name": "overview",
    "description": "Track and convert at once, then summarise.",
    "input_schema": {"type": "object", "properties": {
        "order_id": {"type": "string"}, "to_currency": {"type": "string"}},
        "required": ["order_id", "to_currency"]},
    "steps": [
        {"tool": "find_order"},
        {"tool": "track_parcel", "id": "track", "after": ["find_order"],
         "when": "status != 'processing'", "timeout": 5},
        {"tool": "convert_price", "after": ["find_order"],
         "input_mapping": {"amount_cents": "total_cents", "from_currency": "currency"},
         "retry": {"max_attempts": 2, "retry_on": ["TimeoutError"]}},
        {"tool": "summarise_order", "after": ["track", "convert_price"], "on_error": "skip"},
    ],
}


def test_strict_passes_flows_the_policy_excludes(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--strict")
    assert (code, err) == (0, "")
    assert "Excluded: 3 of 6 flows" in out  # lifecycle, safety, side effects: policy


def test_strict_fails_when_a_flow_is_invalid(capsys: pytest.CaptureFixture,
                                             tmp_path: Path) -> None:
    (tmp_path / "short.flow.yaml").write_text(INVALID)
    argv = ["inspect", FLOWS, str(tmp_path), "--tools", TOOLS]
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, "")  # without --strict the report is all there is
    code, strict_out, err = run(capsys, *argv, "--strict")
    assert code == 1
    assert strict_out == out  # the report is printed all the same
    assert err == ("chainweaver: error: --strict: 1 flow(s) excluded as invalid: short "
                   "v1.0.0: step 1 ('convert_price') needs input field 'to_currency', which "
                   "neither the flow input, an earlier step, a mapping nor a default "
                   "provides\n")


def test_strict_counts_invalid_flows_the_policy_excludes_too(capsys: pytest.CaptureFixture,
                                                             tmp_path: Path) -> None:
    (tmp_path / "short.flow.yaml").write_text(INVALID.replace(
        "safety: {side_effects: none}", "governance: {lifecycle: draft}"))
    code, out, err = run(capsys, "inspect", str(tmp_path), "--tools", TOOLS, "--strict",
                         "--json")
    assert code == 1
    (entry,) = json.loads(out)["flows"]
    assert entry["reason"].startswith("flow is invalid: ")
    assert "1 flow(s) excluded as invalid: short v1.0.0" in err


def test_graph_json_has_steps_edges_and_conditions(capsys: pytest.CaptureFixture,
                                                   tmp_path: Path) -> None:
    (tmp_path / "overview.flow.json").write_text(json.dumps(DAG))
    code, out, err = run(capsys, "inspect", str(tmp_path), "--tools", TOOLS,
                         "--graph", "overview", "--json")
    assert (code, err) == (0, "")
    graph = json.loads(out)
    assert (graph["flow"], graph["version"]) == ("overview", "1.0.0")
    steps = {step["id"]: step for step in graph["steps"]}
    assert list(steps) == ["find_order", "track", "convert_price", "summarise_order"]
    assert steps["track"]["when"] == "status != 'processing'"
    assert (steps["track"]["kind"], steps["track"]["name"]) == ("tool", "track_parcel")
    assert steps["track"]["timeout"] == 5
    assert steps["convert_price"]["input_mapping"] == {"amount_cents": "total_cents",
                                                       "from_currency": "currency"}
    assert steps["convert_price"]["retry"]["max_attempts"] == 2
    assert steps["convert_price"]["retry"]["retry_on"] == ["TimeoutError"]
    assert steps["summarise_order"]["on_error"] == "skip"
    assert steps["summarise_order"]["after"] == ["track", "convert_price"]
    assert sorted((e["from"], e["to"], e["when"]) for e in graph["edges"]) == [
        ("convert_price", "summarise_order", None),
        ("find_order", "convert_price", None),
        ("find_order", "track", "status != 'processing'"),
        ("track", "summarise_order", None)]
    assert graph["order"][0] == "find_order" and graph["order"][-1] == "summarise_order"
    assert graph["last"] == ["summarise_order"]


def test_graph_without_json_is_still_mermaid(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--graph", "order_status")
    assert code == 0
    assert out.splitlines()[0] == "flowchart TD"


@pytest.mark.slow
def test_the_installed_command_exits_1_with_strict(tmp_path: Path) -> None:
    (tmp_path / "short.flow.yaml").write_text(INVALID)
    done = subprocess.run([CHAINWEAVER, "inspect", FLOWS, str(tmp_path), "--tools", TOOLS,
                           "--strict"], cwd=ROOT, capture_output=True, text=True,
                          timeout=STARTUP_TIMEOUT)
    assert done.returncode == 1
    assert done.stdout.startswith("Exposed: 3 of 7 flows")
    assert done.stderr.startswith("chainweaver: error: --strict: 1 flow(s) excluded")
    graph = subprocess.run([CHAINWEAVER, "inspect", FLOWS, "--tools", TOOLS, "--graph",
                            "order_total", "--json"], cwd=ROOT, capture_output=True,
                           text=True, timeout=STARTUP_TIMEOUT)
    assert graph.returncode == 0
    assert json.loads(graph.stdout)["edges"] == [{"from": "find_order", "to": "convert_price",
                                                  "when": None}]
