"""`chainweaver run --caller ID --scope S --claim KEY=VALUE`: a flow that declares step
grants runs from a terminal as a stated caller, each step checked against what it holds;
without a caller it is refused up front (nothing runs), and a malformed flag is a usage
error that says which flag and how to write it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from support.cli import run

pytestmark = pytest.mark.usefixtures("in_repository")

TOOLS = '''
import os
from chainweaver import ToolSafetyContract, tool


def _ran(name):
    with open(os.environ["CW_RAN_LOG"], "a") as log:
        log.write(name + "\\n")


@tool(safety=ToolSafetyContract("read"), requires=["records.read"])
def read_record(tenant: str) -> dict:
    _ran("read_record")
    return {"record": "r-" + tenant}


@tool(safety=ToolSafetyContract("read"), requires={"claims": {"tenant": ["acme"]}})
def summarise(record: str) -> dict:
    _ran("summarise")
    return {"summary": record.upper()}


@tool(safety=ToolSafetyContract("read"), requires={"claims": {"team": ["ops"]}})
def page_ops(summary: str) -> dict:
    _ran("page_ops")
    return {"paged": summary}


@tool(safety=ToolSafetyContract("read"))
def echo(tenant: str) -> dict:
    _ran("echo")
    return {"tenant": tenant}
'''

FLOWS = {
    "guarded.flow.yaml": "name: guarded\ndescription: reads and summarises\n"
                         "steps:\n  - read_record\n  - summarise\n",
    "paging.flow.yaml": "name: paging\ndescription: summarises and pages ops\n"
                        "steps:\n  - read_record\n  - summarise\n  - page_ops\n",
    "open.flow.yaml": "name: open\ndescription: no grants\nsteps:\n  - echo\n",
}
INPUT = ["--input", '{"tenant": "acme"}']
MODULES = itertools.count()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Path]:
    # A module name of its own: the tools loader refuses a second module by one name.
    tools = tmp_path / f"grant_tools_{next(MODULES)}.py"
    tools.write_text(TOOLS)
    for name, text in FLOWS.items():
        (tmp_path / name).write_text(text)
    log = tmp_path / "ran.log"
    monkeypatch.setenv("CW_RAN_LOG", str(log))
    return [str(tmp_path), "--tools", str(tools)], log


def ran(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_flow_with_grants_and_no_caller_is_refused_before_any_step(
        capsys: pytest.CaptureFixture[str], project: tuple[list[str], Path]) -> None:
    sources, log = project
    code, out, err = run(capsys, "run", "guarded", *sources, *INPUT)
    assert code == 2 and out == "" and ran(log) == []
    assert "flow 'guarded' 1.0.0 declares step grants (read_record: scope " \
        "'records.read', summarise: claim 'tenant' in ['acme'])" in err
    assert "pass --caller ID, with --scope SCOPE and --claim KEY=VALUE" in err


def test_a_stated_caller_holding_every_grant_runs_the_flow(
        capsys: pytest.CaptureFixture[str], project: tuple[list[str], Path]) -> None:
    sources, log = project
    code, out, err = run(capsys, "run", "guarded", *sources, *INPUT, "--caller", "ann",
                       "--scope", "records.read", "--claim", "tenant=acme")
    assert code == 0 and json.loads(out) == {"summary": "R-ACME"}, err
    assert ran(log) == ["read_record", "summarise"]


def test_a_step_whose_grant_the_caller_lacks_is_refused_before_it_runs(
        capsys: pytest.CaptureFixture[str], project: tuple[list[str], Path]) -> None:
    sources, log = project
    code, out, err = run(capsys, "run", "guarded", *sources, *INPUT, "--json",
                         "--caller", "ann", "--scope", "records.read",
                         "--claim", "tenant=globex")
    assert code == 1 and ran(log) == ["read_record"]
    document = json.loads(out)
    assert document["error"]["type"] == "StepRefused"
    assert document["error"]["step_id"] == "summarise"
    assert "missing_grant" in document["error"]["message"]


def test_a_claim_given_twice_holds_both_values(
        capsys: pytest.CaptureFixture[str], project: tuple[list[str], Path]) -> None:
    sources, log = project
    code, out, _ = run(capsys, "run", "paging", *sources, *INPUT, "--caller", "ann",
                       "--scope", "records.read", "--claim", "tenant=acme",
                       "--claim", "team=dev", "--claim", "team=ops")
    assert code == 0 and json.loads(out) == {"paged": "R-ACME"}
    assert ran(log) == ["read_record", "summarise", "page_ops"]


def test_a_flow_without_grants_runs_with_or_without_a_caller(
        capsys: pytest.CaptureFixture[str], project: tuple[list[str], Path]) -> None:
    sources, log = project
    assert run(capsys, "run", "open", *sources, *INPUT)[0] == 0
    assert run(capsys, "run", "open", *sources, *INPUT, "--caller", "ann")[0] == 0
    assert ran(log) == ["echo", "echo"]


@pytest.mark.parametrize(("flags", "words"), [
    (["--scope", "records.read"], "--scope describes a caller: pass --caller ID too"),
    (["--claim", "tenant=acme"], "--claim describes a caller: pass --caller ID too"),
    (["--caller", " "], "--caller: the caller id must not be empty"),
    (["--caller", "ann", "--claim", "tenant"],
     "--claim 'tenant': expected KEY=VALUE (say --claim tenant=acme)"),
    (["--caller", "ann", "--claim", "=acme"], "--claim '=acme': expected KEY=VALUE"),
    (["--caller", "ann", "--scope", "records.read records.admin"],
     "--scope 'records.read records.admin': a scope is one word"),
    (["--caller", "ann", "--scope", ""], "--scope '': a scope is one word"),
])
def test_a_malformed_caller_flag_is_a_usage_error_that_says_how(
        capsys: pytest.CaptureFixture[str], project: tuple[list[str], Path],
        flags: list[str], words: str) -> None:
    sources, log = project
    code, out, err = run(capsys, "run", "guarded", *sources, *INPUT, *flags)
    assert code == 2 and out == "" and words in err
    assert ran(log) == []
