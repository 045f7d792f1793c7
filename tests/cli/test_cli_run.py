"""`chainweaver run FLOW PATH... --tools MODULE`: the output on stdout, the step table on
stderr, `--json`, input from text, a file or stdin, versions, approval on a terminal or
refused without one, and the exit codes 0 (succeeded), 1 (failed), 2 (usage, loading)."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run
from support.procs import STARTUP_TIMEOUT

from chainweaver.cli import main

pytestmark = pytest.mark.usefixtures("in_repository")

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "examples/flows"
TOOLS = "examples/flow_tools.py"
CHAINWEAVER = str(Path(sys.executable).parent / "chainweaver")
SHIPPED = {"order_id": "A-1001", "status": "shipped", "eta": "tomorrow",
           "summary": "Order A-1001 is shipped; delivery: tomorrow."}
REFUND = ["run", "refund_order", FLOWS, "--tools", TOOLS,
          "--input", '{"order_id": "A-1001", "reason": "arrived broken"}']


def table(err: str) -> dict[str, list[str]]:
    """The step table's rows by step id (header included as "STEP"); columns are two or
    more spaces apart."""
    rows = [re.split(r"  +", line) for line in err.splitlines()
            if line and not line.startswith("chainweaver:")]
    return {row[0]: row[1:] for row in rows}


class Terminal(io.StringIO):
    """A stdin that says it is a terminal, with the user's answer typed in."""

    def isatty(self) -> bool:
        return True


# ------------------------------------------------------------------ output


def test_the_output_goes_to_stdout_and_the_steps_to_stderr(capsys: pytest.CaptureFixture
                                                           ) -> None:
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                         "--input", '{"order_id": "A-1001"}')
    assert code == 0
    assert json.loads(out) == SHIPPED
    rows = table(err)
    assert rows["STEP"] == ["STATUS", "ATTEMPTS", "DURATION"]
    for step in ("find_order", "track_parcel", "summarise_order"):
        assert rows[step][:2] == ["completed", "1"]
        assert re.fullmatch(r"[0-9.]+ m?s", rows[step][2])
    assert list(rows) == ["STEP", "find_order", "track_parcel", "summarise_order"]


def test_a_failing_flow_exits_1_and_names_the_step(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                         "--input", '{"order_id": "A-1009"}')
    assert (code, out) == (1, "")
    rows = table(err)
    assert rows["STEP"] == ["STATUS", "ATTEMPTS", "DURATION", "ERROR"]
    assert rows["find_order"][:2] == ["failed", "1"]
    assert "no order A-1009" in rows["find_order"][3]
    assert "track_parcel" not in rows
    assert err.splitlines()[-1] == (
        "chainweaver: flow order_status 2.0.0 failed: at step 'find_order': step 0 "
        "('find_order') raised LookupError: no order A-1009")


def test_invalid_input_fails_the_run_naming_the_field(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                         "--input", '{"order_id": "B-1"}')
    assert (code, out) == (1, "")
    assert "no step ran" in err
    last = err.splitlines()[-1]
    assert last.startswith("chainweaver: flow order_status 2.0.0 failed: field 'order_id': "
                           "InputValidationError: flow 'order_status' input is invalid")


def test_json_prints_one_document_and_no_table(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS, "--json",
                         "--input", '{"order_id": "A-1001"}')
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert (document["flow"], document["version"], document["success"]) == (
        "order_status", "2.0.0", True)
    assert document["output"] == SHIPPED
    assert document["error"] is None
    steps = document["steps"]
    assert [s["id"] for s in steps] == ["find_order", "track_parcel", "summarise_order"]
    assert steps[1]["inputs"] == {"carrier": "DHL", "tracking_code": "JD0142"}
    assert steps[1]["outputs"] == {"eta": "tomorrow", "last_scan": "DHL: out for delivery"}
    assert all(s["status"] == "completed" and s["attempts"] == 1 for s in steps)


def test_json_of_a_failed_run_has_the_error(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS, "--json",
                         "--input", '{"order_id": "A-1009"}')
    assert (code, err) == (1, "")
    document = json.loads(out)
    assert document["success"] is False and document["output"] is None
    assert document["error"]["type"] == "LookupError"
    assert document["error"]["step_id"] == "find_order"
    assert [(s["id"], s["status"]) for s in document["steps"]] == [("find_order", "failed")]


def test_sub_flow_steps_are_listed_under_their_step(capsys: pytest.CaptureFixture,
                                                    tmp_path: Path) -> None:
    (tmp_path / "inner.flow.yaml").write_text("name: inner\ndescription: I.\n"
                                              "steps: [find_order]\n")
    (tmp_path / "outer.flow.yaml").write_text("name: outer\ndescription: O.\n"
                                              "steps: [{flow: inner}, track_parcel]\n")
    code, out, err = run(capsys, "run", "outer", str(tmp_path), "--tools", TOOLS,
                         "--input", '{"order_id": "A-1001"}')
    assert code == 0
    assert json.loads(out) == {"eta": "tomorrow", "last_scan": "DHL: out for delivery"}
    assert list(table(err)) == ["STEP", "inner", "inner/find_order", "track_parcel"]


def test_what_tools_print_does_not_reach_stdout(capsys: pytest.CaptureFixture,
                                                tmp_path: Path) -> None:
    tools = tmp_path / "chatty_tools.py"
    tools.write_text("from chainweaver import tool\nprint('importing')\n\n"
                     "@tool\ndef shout(text: str) -> dict:\n"
                     "    print('shouting')\n    return {'text': text.upper()}\n")
    (tmp_path / "shout.flow.yaml").write_text("name: shout\ndescription: S.\nsteps: [shout]\n")
    code, out, err = run(capsys, "run", "shout", str(tmp_path), "--tools", str(tools),
                         "--input", '{"text": "hi"}')
    assert code == 0
    assert json.loads(out) == {"text": "HI"}
    assert "importing" in err and "shouting" in err


# ------------------------------------------------------------------ input and version


def test_input_from_a_file_and_from_stdin(capsys: pytest.CaptureFixture, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    given = tmp_path / "input.json"
    given.write_text('{"order_id": "A-1002"}')
    code, out, _ = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                       "--input-file", str(given))
    assert code == 0 and json.loads(out)["status"] == "processing"
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"order_id": "A-1003"}'))
    code, out, _ = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                       "--input-file", "-")
    assert code == 0 and json.loads(out)["status"] == "delivered"


def test_version_picks_an_older_version(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    (tmp_path / "v1.flow.yaml").write_text("name: lookup\nversion: '1.0.0'\ndescription: L.\n"
                                           "steps: [find_order]\n")
    (tmp_path / "v2.flow.yaml").write_text("name: lookup\nversion: '2.0.0'\ndescription: L.\n"
                                           "steps: [find_order, track_parcel]\n")
    argv = ["run", "lookup", str(tmp_path), "--tools", TOOLS, "--input",
            '{"order_id": "A-1001"}']
    code, out, _ = run(capsys, *argv)
    assert code == 0 and set(json.loads(out)) == {"eta", "last_scan"}
    code, out, _ = run(capsys, *argv, "--version", "1.0.0")
    assert code == 0 and json.loads(out)["customer_id"] == "C-7"
    code, out, err = run(capsys, *argv, "--version", "3.0.0")
    assert (code, out) == (2, "")
    assert err.startswith("chainweaver: error: ") and "3.0.0" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--input", "{oops"], "--input: not JSON: Expecting property name enclosed in double "
                           "quotes at line 1, column 2"),
    (["--input", "[1, 2]"], "--input: the input must be a JSON object"),
    (["--input-file", "no/such/input.json"], "--input-file no/such/input.json: no such file"),
])
def test_bad_input_is_a_usage_error(capsys: pytest.CaptureFixture, argv: list[str],
                                    message: str) -> None:
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"chainweaver: error: {message}")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_past_pythons_digit_limit_is_a_usage_error(
        capsys: pytest.CaptureFixture, tmp_path: Path, sign: str) -> None:
    # json.loads raises ValueError for more than 4300 digits: once exit 1 and a traceback.
    given = tmp_path / "input.json"
    given.write_text('{"order_id": "A-1002", "count": ' + sign + "9" * 5000 + "}")
    for argv, source in ((["--input-file", str(given)], f"--input-file {given}"),
                         (["--input", given.read_text()], "--input")):
        code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS, *argv)
        assert (code, out) == (2, "")
        assert err == (f"chainweaver: error: {source}: an integer of 5000 digits is too "
                       f"long (at most {sys.get_int_max_str_digits()})\n")


def test_a_version_past_pythons_digit_limit_is_a_usage_error(
        capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                         "--version", "1." + "9" * 5000 + ".0")
    assert (code, out) == (2, "")
    assert err.startswith("chainweaver: error: version '1.9999")
    assert "at most 256 are allowed" in err and len(err.splitlines()) == 1


def test_input_and_input_file_together_are_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "order_status", FLOWS, "--tools", TOOLS, "--input", "{}",
              "--input-file", "-"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# ------------------------------------------------------------------ loading errors


def test_an_unknown_flow_suggests_the_closest(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "run", "order_stat", FLOWS, "--tools", TOOLS)
    assert (code, out) == (2, "")
    assert "(did you mean 'order_status'?)" in err
    assert "flows in the files: churn_risk, help_search, legacy_ticket" in err


@pytest.mark.parametrize(("files", "tools", "message"), [
    ({"bad.flow.yaml": "name: bad\ndescription: B.\nsteps: [find_ordr]\n"}, TOOLS,
     "steps[0].tool: no tool named 'find_ordr' is registered (did you mean 'find_order'?"),
    ({"ok.flow.yaml": "name: ok\ndescription: O.\nsteps: [find_order]\n"},
     "examples/no_such_tools.py", "--tools examples/no_such_tools.py: no such file"),
    ({"retried.flow.yaml": "name: retried\ndescription: R.\nsteps:\n  - tool: issue_refund\n"
                           "    retry: {max_attempts: 2}\n"}, TOOLS,
     "flow 'retried' 1.0.0 cannot run: step 0 ('issue_refund') has a retry policy"),
])
def test_loading_errors_exit_2(capsys: pytest.CaptureFixture, tmp_path: Path,
                               files: dict[str, str], tools: str, message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    flow = next(iter(files)).split(".")[0]
    code, out, err = run(capsys, "run", flow, str(tmp_path), "--tools", tools)
    assert (code, out) == (2, "")
    assert message in err
    assert len(err.splitlines()) == 1 and err.startswith("chainweaver: error: ")


# ------------------------------------------------------------------ approval


def test_approval_is_refused_without_a_terminal(capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # piped: never read as a yes
    code, out, err = run(capsys, *REFUND)
    assert (code, out) == (1, "")
    assert "not asking, standard input is not a terminal: pass --yes to approve" in err
    assert "no step ran" in err
    assert "ApprovalDenied" in err.splitlines()[-1]


@pytest.mark.parametrize(("answer", "code"), [("y\n", 0), ("yes\n", 0), ("n\n", 1), ("\n", 1),
                                              ("", 1)])
def test_approval_is_asked_on_a_terminal(capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch, answer: str,
                                         code: int) -> None:
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    exit_code, out, err = run(capsys, *REFUND)
    assert exit_code == code
    assert "chainweaver: flow 'refund_order' 1.0.0 needs approval: step 'find_order'" in err
    assert "step 'issue_refund' (tool 'issue_refund', write: moves money back" in err
    assert "Run it? [y/N]" in err
    if code == 0:
        assert json.loads(out)["refund_id"] == "R-A-1001"
    else:
        assert out == "" and "ApprovalDenied" in err


def test_yes_approves_without_asking(capsys: pytest.CaptureFixture,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out, err = run(capsys, *REFUND, "--yes")
    assert code == 0
    assert json.loads(out)["refunded_cents"] == 4599
    assert "needs approval" not in err


# ------------------------------------------------------------------ the installed command


def command(*argv: str, **options: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHAINWEAVER, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=STARTUP_TIMEOUT, **options)  # type: ignore[call-overload]


@pytest.mark.slow
def test_the_installed_command_runs_a_flow() -> None:
    done = command("run", "order_status", FLOWS, "--tools", TOOLS,
                   "--input", '{"order_id": "A-1001"}')
    assert done.returncode == 0
    assert json.loads(done.stdout) == SHIPPED
    table_lines = [line for line in done.stderr.splitlines()
                   if not line.startswith("chainweaver: ")]  # after the progress lines
    assert table_lines[0].split() == ["STEP", "STATUS", "ATTEMPTS", "DURATION"]
    failed = command("run", "order_status", FLOWS, "--tools", TOOLS, "--json",
                     "--input-file", "-", input='{"order_id": "A-1009"}')
    assert (failed.returncode, failed.stderr) == (1, "")
    assert json.loads(failed.stdout)["error"]["type"] == "LookupError"
    usage = command("run", "order_status", FLOWS, "--tools", TOOLS, "--input", "[]")
    assert (usage.returncode, usage.stdout) == (2, "")
    assert usage.stderr.startswith("chainweaver: error: --input: the input must be")


@pytest.mark.slow
def test_the_installed_command_refuses_approval_without_a_terminal() -> None:
    done = command(*REFUND, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout) == (1, "")
    assert "pass --yes to approve" in done.stderr


@pytest.mark.slow
def test_the_installed_command_asks_on_a_real_terminal() -> None:
    main_fd, terminal_fd = pty.openpty()
    try:
        os.write(main_fd, b"y\n")  # typed ahead: the terminal holds it until read
        done = command(*REFUND, stdin=terminal_fd)
    finally:
        os.close(terminal_fd)
        os.close(main_fd)
    assert done.returncode == 0, done.stderr
    assert "Run it? [y/N]" in done.stderr
    assert json.loads(done.stdout)["refund_id"] == "R-A-1001"


@pytest.mark.parametrize("text, problem", [
    ('{"order_id": NaN}', "NaN is not a JSON value"),
    ('{"order_id": "A-1001", "n": -Infinity}', "-Infinity is not a JSON value"),
])
def test_an_input_with_nan_or_infinity_is_not_json(capsys: pytest.CaptureFixture, text: str,
                                                   problem: str) -> None:
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                         "--input", text)
    assert (code, out, err) == (2, "", f"chainweaver: error: --input: not JSON: {problem}\n")


def test_an_input_file_is_read_up_to_a_bound(capsys: pytest.CaptureFixture,
                                             tmp_path: Path) -> None:
    # /dev/zero, or an endless pipe, as --input-file filled the memory: what is over
    # 16 MiB is refused after reading one byte past it.
    from chainweaver.cli.run import MAX_INPUT_BYTES
    big = tmp_path / "big.json"
    big.write_bytes(b'{"order_id": "' + b"x" * MAX_INPUT_BYTES + b'"}')
    code, out, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                         "--input-file", str(big))
    assert (code, out) == (2, "")
    assert err == (f"chainweaver: error: --input-file {big}: larger than 16777216 bytes "
                   "(an input is read whole into memory)\n")
    fits = tmp_path / "fits.json"
    fits.write_text(json.dumps({"order_id": "A-1001"}) + " " * 1000)
    code, out, _ = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                       "--input-file", str(fits), "--no-progress")
    assert code == 0 and json.loads(out)["order_id"] == "A-1001"
