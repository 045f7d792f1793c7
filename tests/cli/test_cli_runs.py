"""`--approval` and `--approval-timeout`: what `inspect` reports, and bad values."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainweaver.cli import main

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["tests/servers/runs", "--tools", "tests/servers/runs/run_tools.py",
        "--side-effects", "none,read,write"]


@pytest.fixture(autouse=True)
def in_repository(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_approval_elicit_publishes_and_marks_the_flow(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    code, out, _ = run(capsys, "inspect", *ARGS, "--approval", "elicit",
                       "--approval-timeout", "30", "--json")
    assert code == 0
    flows = {entry["flow_name"]: entry for entry in json.loads(out)["flows"]}
    assert flows["pay"]["exposed"] and flows["pay"]["needs_approval"] is True
    assert flows["stuck"]["needs_approval"] is False
    code, out, _ = run(capsys, "inspect", *ARGS, "--approval", "elicit")
    assert code == 0 and "pay (asks approval)" in out


def test_default_excludes_flows_that_need_approval(capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    code, out, _ = run(capsys, "inspect", *ARGS, "--json")
    flows = {entry["flow_name"]: entry for entry in json.loads(out)["flows"]}
    assert code == 0 and not flows["pay"]["exposed"]
    assert "requires approval" in flows["pay"]["reason"]


@pytest.mark.parametrize("argv", [["--approval", "ask"], ["--approval-timeout", "0"],
                                  ["--approval-timeout", "soon"]])
def test_bad_values_are_refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["inspect", *ARGS, *argv])
    assert exited.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_no_run_notifications_reaches_the_server(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from chainweaver.mcp import FlowServer

    served: list[FlowServer] = []
    monkeypatch.setattr(FlowServer, "serve", lambda self, *a, **k: served.append(self))
    assert run(capsys, "serve", *ARGS)[0] == 0
    assert run(capsys, "serve", *ARGS, "--no-run-notifications")[0] == 0
    assert [server.serving.run_notifications for server in served] == [True, False]
