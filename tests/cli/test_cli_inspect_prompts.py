"""`chainweaver inspect` shows each published prompt: its arguments and its messages
rendered with placeholder values; `--prompt-kinds` / `--prompt-flow` narrow them and the
withheld ones are listed with why; an opted-out flow shows its own reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run

pytestmark = pytest.mark.usefixtures("in_repository")

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "examples/flows"
TOOLS = "examples/flow_tools.py"


def test_inspect_renders_every_published_prompt_with_placeholders(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--expose-prompts", "--prompts",
                       "--json")
    assert code == 0
    document = json.loads(out)
    templates = {t["name"]: t for t in document["prompt_templates"]}
    assert sorted(templates) == document["prompts"]
    invocation = templates["order_status"]
    assert invocation["kind"] == "invocation" and invocation["flow"] == "order_status"
    assert [a["name"] for a in invocation["arguments"]] == ["order_id"]
    assert '"order_id": "[order_id]"' in invocation["messages"][0]["text"]
    authored = [t for t in templates.values() if t["kind"] == "authored"]
    assert authored and all(t["messages"] for t in authored)
    for template in authored:
        for argument in template["arguments"]:
            if argument["required"]:
                assert any(f"[{argument['name']}]" in m["text"]
                           for m in template["messages"]), template["name"]
    assert templates["chainweaver_guide"]["kind"] == "guide"
    assert "`order_status`" in templates["chainweaver_guide"]["messages"][0]["text"]

    code, table, _ = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--expose-prompts",
                         "--prompts")
    assert code == 0
    assert f"Prompts: {len(templates)} published" in table
    assert "  order_status (invocation, flow order_status)" in table
    assert "    argument order_id (required)" in table
    assert '"order_id": "[order_id]"' in table


def test_prompt_flags_narrow_the_prompts_and_the_rest_are_listed_as_withheld(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--expose-prompts", "--prompts",
                       "--prompt-kinds", "authored", "--json")
    assert code == 0
    document = json.loads(out)
    assert {t["kind"] for t in document["prompt_templates"]} == {"authored"}
    assert "order_status" not in document["prompts"] and document["tools"]
    flow = next(f for f in document["flows"] if f["flow_name"] == "order_status")
    assert flow["withheld_prompts"] == {
        "order_status": "invocation prompts are not published (prompt kinds: authored)"}
    code, table, _ = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--expose-prompts",
                         "--prompts", "--prompt-kinds", "invocation,guide",
                         "--prompt-flow", "order_total")
    assert code == 0
    assert "Prompts withheld by the prompt policy" in table
    assert "  order_status (flow order_status): flow not listed in the prompt policy's " \
           "flow_names" in table
    code, _, err = run(capsys, "inspect", FLOWS, "--tools", TOOLS, "--expose-prompts", "--prompts",
                       "--prompt-kinds", "toolset")
    assert code != 0 and "unknown kind(s) toolset" in err


def test_an_opted_out_flow_shows_its_own_reason(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    source = (ROOT / FLOWS / "order_status.flow.yaml").read_text(encoding="utf-8")
    hidden = source.replace("name: order_status", "name: order_status_hidden", 1)
    hidden = hidden.replace("governance:\n", "governance:\n  publish: false\n", 1) \
        if "governance:\n" in hidden else hidden + "governance:\n  publish: false\n"
    (tmp_path / "hidden.flow.yaml").write_text(hidden, encoding="utf-8")
    code, out, _ = run(capsys, "inspect", str(tmp_path), "--tools", TOOLS)
    assert code == 0
    assert "order_status_hidden" in out
    assert "the flow opts out of publishing (governance publish: false)" in out
