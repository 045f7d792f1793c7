"""Text a flow file holds reaches a terminal only as text: a key, a step id or a
condition carrying an escape sequence (``\\x1b[2J`` clears the screen) is shown
escaped in every error line, report and graph, and a step id cannot hold one (nor a
'/', which joins the steps of a sub-flow) at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run

pytestmark = pytest.mark.usefixtures("in_repository")

TOOLS = "examples/flow_tools.py"
ESC = "\x1b[2J\x1b[31m"


def write(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_key_with_an_escape_sequence_is_shown_escaped(capsys: pytest.CaptureFixture,
                                                         tmp_path: Path) -> None:
    path = write(tmp_path, "esc.flow.json", json.dumps(
        {"name": "esc", "description": "d", "steps": ["find_order"], f"x{ESC}": 1}))
    code, out, err = run(capsys, "inspect", path, "--tools", TOOLS)
    assert code == 1 and "\x1b" not in out + err
    assert err == (f"chainweaver: error: {path}: x\\x1b[2J\\x1b[31m: unknown key (allowed: "
                   "name, version, title, description, governance, safety, input_schema, "
                   "output_schema, steps, prompts, task_mode, requires, delegations)\n")
    code, out, err = run(capsys, "validate", path)
    assert code == 1 and "\x1b" not in out + err
    assert out.startswith(f"{path}:1: esc: x\\x1b[2J\\x1b[31m: unknown key")


@pytest.mark.parametrize("step_id", [f"a{ESC}b", "a/b", "tab\there", "nul\x00", "a#b"])
def test_a_step_id_with_a_control_character_or_a_slash_is_refused(
        capsys: pytest.CaptureFixture, tmp_path: Path, step_id: str) -> None:
    path = write(tmp_path, "ids.flow.json", json.dumps(
        {"name": "ids", "description": "d", "steps": [{"tool": "find_order", "id": step_id}]}))
    code, out, err = run(capsys, "validate", path, "--tools", TOOLS, "--json")
    assert code == 1
    [problem] = json.loads(out)["problems"]
    assert (problem["field"], problem["message"]) == (
        "steps[0]", f"step {step_id!r}: id must not hold '/' (it joins the ids of a "
        "sub-flow's steps: 'outer/inner'), '#' (it names a fallback's key and a hidden "
        "sub-flow: 'subflow#1') or control characters")
    code, out, err = run(capsys, "run", "ids", path, "--tools", TOOLS, "--input",
                         '{"order_id": "A-1001"}')
    assert code == 2 and "\x1b" not in out + err and "\t" not in err


def test_a_condition_with_an_escape_sequence_is_drawn_without_it(
        capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    path = write(tmp_path, "graph.flow.json", json.dumps(
        {"name": "graph", "description": "d",
         "steps": ["find_order", {"tool": "track_parcel", "when": f"status == '{ESC}'"}]}))
    code, out, err = run(capsys, "inspect", path, "--tools", TOOLS, "--graph", "graph")
    assert code == 0 and "\x1b" not in out + err
    assert "when: status == ' [2J [31m'" in out
