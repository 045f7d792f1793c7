"""`chainweaver validate PATH... [--tools MODULE] [--json]`: every problem of
every file with its file, line and flow, the checks `--tools` adds, exit codes 0/1/2,
and no MCP import (it runs in pre-commit hooks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.procs import STARTUP_TIMEOUT

from chainweaver.cli import main
from chainweaver.cli.locate import field_tokens, line_of

pytestmark = pytest.mark.usefixtures("in_repository")

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "examples/flow_tools.py"
CHAINWEAVER = str(Path(sys.executable).parent / "chainweaver")

# Each file has one loader problem, on the line given.
BROKEN = {
    "a_unknown_key.flow.yaml": ("name: ping\ndescription: P.\nsteps: [find_order]\n"
                                "stpes: []\n", 4, "ping", "stpes",
                                "unknown key (did you mean 'steps'?"),
    "b_syntax.flow.yaml": ("name: pong\ndescription: P.\nsteps: [find_order\n", 4, None, None,
                           "invalid YAML at line 4, column 1"),
    "c_bad_value.flow.json": ('{\n  "name": "lc",\n  "description": "L.",\n'
                              '  "governance": {\n    "lifecycle": "live"\n  },\n'
                              '  "steps": ["find_order"]\n}\n', 5, "lc",
                              "governance.lifecycle", "must be one of draft, reviewed"),
    "d_bad_when.flow.yaml": ("name: cond\ndescription: C.\nsteps:\n  - find_order\n"
                             "  - tool: track_parcel\n    when: status ==\n", 6, "cond",
                             "steps[1].when", ""),
}
# Loads, but its steps do not fit the tools: several problems in one flow.
MISFIT = ("name: misfit\ndescription: M.\nsteps:\n  - find_order\n"
          "  - tool: convert_price\n    input_mapping:\n      amount: total_cents\n"
          "  - tool: summarise_ordr\n")


def write(directory: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (directory / name).write_text(text)
    return str(directory)


def problems(out: str) -> list[dict[str, Any]]:
    document = json.loads(out)
    found: list[dict[str, Any]] = document["problems"]
    return found


# ------------------------------------------------------------------ reports


def test_sound_flows_pass(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "validate", "examples/flows", "--tools", TOOLS)
    assert (code, out, err) == (0, "6 flow file(s) checked: no problems\n", "")


def test_every_file_is_reported_with_its_line_and_flow(capsys: pytest.CaptureFixture,
                                                       tmp_path: Path) -> None:
    write(tmp_path, {name: case[0] for name, case in BROKEN.items()})
    (tmp_path / "good.flow.yaml").write_text("name: good\ndescription: G.\n"
                                             "steps: [find_order]\n")
    code, out, err = run(capsys, "validate", str(tmp_path), "--format", "json")
    assert (code, err) == (1, "")
    found = problems(out)
    assert [Path(p["file"]).name for p in found] == sorted(BROKEN)
    for problem in found:
        _, line, flow, field, message = BROKEN[Path(problem["file"]).name]
        assert (problem["line"], problem["flow"], problem["field"]) == (line, flow, field)
        assert problem["message"].startswith(message)
        assert problem["kind"] == "FlowFileError"
    assert json.loads(out)["files"] == 5 and json.loads(out)["flows"] == 1


def test_text_lines_are_file_line_flow_field_message(capsys: pytest.CaptureFixture,
                                                     tmp_path: Path) -> None:
    write(tmp_path, {name: case[0] for name, case in BROKEN.items()})
    code, out, _ = run(capsys, "validate", str(tmp_path))
    lines = out.splitlines()
    assert code == 1
    assert lines[0].startswith(f"{tmp_path}/a_unknown_key.flow.yaml:4: ping: stpes: unknown "
                               "key (did you mean 'steps'?")
    assert lines[1].startswith(f"{tmp_path}/b_syntax.flow.yaml:4: invalid YAML at line 4")
    assert lines[2].startswith(f"{tmp_path}/c_bad_value.flow.json:5: lc: "
                               "governance.lifecycle: must be one of")
    assert lines[-1] == "4 problem(s) in 4 of 4 flow file(s)"


def test_tools_add_the_static_checks_every_problem_at_once(capsys: pytest.CaptureFixture,
                                                           tmp_path: Path) -> None:
    write(tmp_path, {"misfit.flow.yaml": MISFIT})
    code, out, _ = run(capsys, "validate", str(tmp_path), "--format", "json")
    assert code == 0  # without --tools the steps are not checked
    assert json.loads(out)["tools_checked"] is False
    code, out, _ = run(capsys, "validate", str(tmp_path), "--tools", TOOLS, "--format", "json")
    assert code == 1
    found = [(p["line"], p["field"], p["kind"]) for p in problems(out)]
    assert (7, "steps[1].input_mapping.amount", "UnknownFieldError") in found
    assert (8, "steps[2]", "ToolNotFoundError") in found
    missing = [p for p in problems(out) if p["kind"] == "MissingContextKeyError"]
    assert {p["message"].split("needs input field ")[1].split("'")[1] for p in missing} == {
        "amount_cents", "from_currency", "to_currency"}
    assert all(p["flow"] == "misfit" for p in problems(out))


def test_data_flow_problems_are_reported_like_the_server_excludes_them(
    capsys: pytest.CaptureFixture, tmp_path: Path,
) -> None:
    write(tmp_path, {"short.flow.yaml": "name: short\ndescription: S.\nsteps:\n"
                                        "  - find_order\n  - tool: convert_price\n"
                                        "    input_mapping: {amount_cents: total_cents, "
                                        "from_currency: currency}\n"})
    code, out, _ = run(capsys, "validate", str(tmp_path), "--tools", TOOLS)
    assert code == 1
    assert out.splitlines()[0] == (
        f"{tmp_path}/short.flow.yaml:5: short: steps[1]: step 1 ('convert_price') needs "
        "input field 'to_currency', which neither the flow input, an earlier step, a "
        "mapping nor a default provides")


def test_duplicate_flows_name_both_files(capsys: pytest.CaptureFixture, tmp_path: Path
                                         ) -> None:
    write(tmp_path, {"a.flow.yaml": "name: twin\ndescription: T.\nsteps: [find_order]\n",
                     "b.flow.json": '{\n  "name": "twin",\n  "version": "1.0",\n'
                                    '  "description": "T.",\n  "steps": ["find_order"]\n}\n'})
    code, out, _ = run(capsys, "validate", str(tmp_path), "--tools", TOOLS)
    assert code == 1
    assert out.splitlines()[0] == (f"{tmp_path}/b.flow.json:3: twin: version: flow 'twin' "
                                   f"version '1.0' is already defined in {tmp_path}/a.flow.yaml")


@pytest.mark.parametrize("tools", [[], ["--tools", TOOLS]])
def test_a_version_past_pythons_digit_limit_is_a_problem_with_file_and_line(
        capsys: pytest.CaptureFixture, tmp_path: Path, tools: list[str]) -> None:
    # int() refuses more than 4300 digits: once a ValueError traceback and no report.
    write(tmp_path, {"a_long.flow.yaml": 'name: long\ndescription: L.\nversion: "1.'
                                         + "9" * 5000 + '.0"\nsteps: [find_order]\n',
                     "b_next.flow.json": '{"name": "next", "description": "N.",\n'
                                         '"steps": [{"tool": "find_ordr"}]}\n'})
    code, out, err = run(capsys, "validate", str(tmp_path), *tools, "--format", "json")
    assert (code, err) == (1, "")
    document = json.loads(out)
    assert (document["files"], document["flows"]) == (2, 1)
    first = document["problems"][0]
    assert (Path(first["file"]).name, first["line"], first["flow"], first["field"],
            first["kind"]) == ("a_long.flow.yaml", 3, "long", "version", "FlowFileError")
    assert first["message"] == ("version '1.99999999999999999999999999999999999...' is 5004 "
                                "characters long; at most 256 are allowed")
    if tools:  # the next file is still checked
        assert [p["kind"] for p in document["problems"][1:]] == ["ToolNotFoundError"]
    code, out, _ = run(capsys, "validate", str(tmp_path / "a_long.flow.yaml"))
    assert code == 1 and out.startswith(f"{tmp_path}/a_long.flow.yaml:3: long: version: ")


def test_an_unknown_sub_flow_is_found_with_tools(capsys: pytest.CaptureFixture,
                                                 tmp_path: Path) -> None:
    write(tmp_path, {"outer.flow.yaml": "name: outer\ndescription: O.\n"
                                        "steps: [{flow: innr}]\n",
                     "inner.flow.yaml": "name: inner\ndescription: I.\nsteps: [find_order]\n"})
    code, out, _ = run(capsys, "validate", str(tmp_path), "--tools", TOOLS, "--format", "json")
    assert code == 1
    (problem,) = problems(out)
    assert (problem["flow"], problem["kind"], problem["line"]) == ("outer",
                                                                   "FlowNotFoundError", 3)


# ------------------------------------------------------------------ usage errors


@pytest.mark.parametrize(("argv", "message"), [
    (["examples/no_such_flows"], "examples/no_such_flows: no such file or directory"),
    (["examples/flows", "--tools", "no_such_package.tools"],
     "--tools no_such_package.tools: no module named 'no_such_package'"),
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture, argv: list[str], message: str
                             ) -> None:
    code, out, err = run(capsys, "validate", *argv)
    assert (code, out, err) == (2, "", f"chainweaver: error: {message}\n")


def test_the_shipped_examples_validate_cleanly_as_the_docs_show_them(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "flow_tools", raising=False)  # as in a new process
    # Their model references name the tools module (flow_tools:OrderQuery), which only
    # --tools puts on the import path: without it they are unchecked, and said so.
    code, out, err = run(capsys, "validate", "examples/flows")
    assert (code, err) == (0, "")
    assert out == ("6 flow file(s) checked: no problems (steps not checked against tools, "
                   "nor model references to flow_tools: give --tools)\n")
    code, out, _ = run(capsys, "validate", "examples/flows", "--json")
    assert code == 0
    assert json.loads(out)["models_unchecked"] == ["flow_tools"]


def test_model_references_are_problems_when_they_can_be_checked(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "flow_tools", raising=False)  # as in a new process
    write(tmp_path, {"typo.flow.yaml": "name: typo\ndescription: T.\nsteps: [find_order]\n"
                                       "input_schema: flow_tools:OrderQry\n",
                     "lost.flow.yaml": "name: lost\ndescription: L.\nsteps: [find_order]\n"
                                       "output_schema: no_such_models:Order\n",
                     "found.flow.yaml": "name: found\ndescription: F.\nsteps: [find_order]\n"
                                        "input_schema: json:Order\n"})
    # A module found from here is imported and checked, with or without --tools.
    code, out, _ = run(capsys, "validate", str(tmp_path), "--json")
    assert code == 1
    assert [(Path(p["file"]).name, p["field"]) for p in problems(out)] == [
        ("found.flow.yaml", "input_schema")]
    assert json.loads(out)["models_unchecked"] == ["flow_tools", "no_such_models"]
    # With --tools, every reference is checked: a module that cannot be found is a problem.
    code, out, _ = run(capsys, "validate", str(tmp_path), "--tools", TOOLS, "--json")
    assert code == 1
    found = {Path(p["file"]).name: p["message"] for p in problems(out)}
    assert sorted(found) == ["found.flow.yaml", "lost.flow.yaml", "typo.flow.yaml"]
    assert "no_such_models" in found["lost.flow.yaml"]
    assert "OrderQry" in found["typo.flow.yaml"]
    assert json.loads(out)["models_unchecked"] == []


def test_json_is_spelled_json_as_in_every_command(capsys: pytest.CaptureFixture) -> None:
    spelled = [run(capsys, "validate", "examples/flows", "--tools", TOOLS, *flag)
               for flag in (["--json"], ["--format", "json"])]
    assert spelled[0] == spelled[1]
    assert spelled[0][0] == 0 and json.loads(spelled[0][1])["tools_checked"] is True


def test_a_bad_format_is_refused_by_argparse(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["validate", "examples/flows", "--format", "xml"])
    assert exited.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


# ------------------------------------------------------------------ locating fields


def test_fields_are_located_in_yaml_and_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "x.flow.yaml"
    yaml_file.write_text("name: x\ninput_schema:\n  properties:\n    a.b:\n      type: string\n"
                         "steps:\n  - find_order\n  - tool: convert_price\n"
                         "    input_mapping:\n      amount: total\n")
    json_file = tmp_path / "x.flow.json"
    json_file.write_text(json.dumps({
        "name": "x", "input_schema": {"properties": {"a.b": {"type": "string"}}},
        "steps": ["find_order", {"tool": "convert_price",
                                 "input_mapping": {"amount": "total"}}]}, indent=2))
    for path, expected in ((yaml_file, {"name": 1, "input_schema.properties.a.b.type": 5,
                                        "steps[1]": 8, "steps[1].input_mapping.amount": 10,
                                        "steps[1].nothing": 8, None: 1}),
                           (json_file, {"name": 2, "input_schema.properties.a.b.type": 6,
                                        "steps[1]": 12, "steps[1].input_mapping.amount": 15,
                                        "steps[1].nothing": 12, None: 1})):
        for field, line in expected.items():
            assert line_of(path, field) == line, (path.name, field)
    assert line_of(yaml_file, "steps", "invalid YAML at line 9, column 2") == 9
    assert field_tokens("steps[1].retry.retry_on[0]") == ["steps", 1, "retry", "retry_on", 0]


def test_a_key_with_a_long_index_is_located_without_reading_the_number(
        capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    # A key "x[999...]" named in a field once made int() raise (over 4300 digits).
    huge = "9" * 5000
    assert field_tokens(f"x[{huge}].y") == ["x", huge, "y"]
    path = tmp_path / "k.flow.json"
    path.write_text(json.dumps({"name": "k", "description": "K.", "steps": [
        {"tool": "find_order", "input_mapping": {f"t[{huge}]": "order_id"}}]}, indent=1))
    assert line_of(path, f"steps[0].input_mapping.t[{huge}]") == 7  # its mapping
    assert line_of(path, "name", f"at line {huge}") == 2  # no such line: the field's
    code, out, err = run(capsys, "validate", str(path), "--tools", TOOLS)
    assert (code, err) == (1, "")
    assert out.startswith(f"{path}:7: k: steps[0].input_mapping.t[{huge}]: step 0 "
                          f"('find_order') maps field 't[{huge}]'")


# ------------------------------------------------------------------ the installed command


@pytest.mark.slow
def test_the_installed_command_validates_without_importing_mcp(tmp_path: Path) -> None:
    write(tmp_path, {name: case[0] for name, case in BROKEN.items()})
    code = ("import sys\nfrom chainweaver.cli import main\n"
            f"code = main(['validate', {str(tmp_path)!r}, 'examples/flows', '--tools', "
            f"{TOOLS!r}])\n"
            "print(sorted(m for m in ('fastmcp', 'mcp') if m in sys.modules))\n"
            "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=STARTUP_TIMEOUT)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == "[]"
    assert done.stdout.splitlines()[-2] == "4 problem(s) in 4 of 10 flow file(s)"
    clean = subprocess.run([CHAINWEAVER, "validate", "examples/flows", "--tools", TOOLS,
                            "--format", "json"], cwd=ROOT, capture_output=True, text=True,
                           timeout=STARTUP_TIMEOUT)
    assert clean.returncode == 0
    assert json.loads(clean.stdout) == {"files": 6, "flows": 6, "tools_checked": True,
                                        "models_unchecked": [], "problems": []}


def test_a_flow_file_never_makes_validate_import_a_module(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 'this' prints the Zen of Python when imported: a model reference naming it must
    # leave it unimported, with or without --tools, and say why with --tools.
    for name in ("this", "antigravity"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    write(tmp_path, {"zen.flow.yaml": "name: zen\ndescription: Z.\nsteps: [find_order]\n"
                                      "input_schema: this:Zen\n",
                     "sub.flow.yaml": "name: sub\ndescription: S.\nsteps: [find_order]\n"
                                      "output_schema: antigravity.sub:Model\n"})
    code, out, err = run(capsys, "validate", str(tmp_path), "--json")
    assert (code, json.loads(out)["models_unchecked"]) == (0, ["antigravity.sub", "this"])
    code, out, err = run(capsys, "validate", str(tmp_path), "--tools", TOOLS, "--json")
    assert code == 1
    assert {p["field"]: p["message"] for p in problems(out)} == {
        "input_schema": "module 'this' is not imported: a flow file only names what is "
                        "already imported (a --tools module, or a module it imports) and "
                        "never imports a module itself",
        "output_schema": "module 'antigravity.sub' is not imported: a flow file only names "
                         "what is already imported (a --tools module, or a module it "
                         "imports) and never imports a module itself"}
    assert "Zen of Python" not in out + err
    assert "this" not in sys.modules and "antigravity" not in sys.modules
