"""`chainweaver inspect` on a hostile flow file (an alias bomb, nesting past Python's
recursion limit, an integer or a version past its digit limit, a misspelt retry_on name)
exits 1, the code for an invalid flow file, with one line naming the file and the line
or field: never a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainweaver.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "examples/flow_tools.py"
HEAD = "name: ping\ndescription: d\nsteps: [find_order]\n"

BAD = {
    "bomb.flow.yaml": (HEAD + "input_schema:\n  type: object\n  examples: &a [lol, lol]\n"
                       + "".join(f"  x{n}: &b{n} [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                                 for n in range(3)),
                       "not allowed at line 6, column 13: YAML anchors and aliases"),
    "deep.flow.yaml": (HEAD + "x: " + "[" * 20_000 + "]" * 20_000 + "\n",
                       "over a limit at line 4, column 67: nested more than 64 levels"),
    "deep.flow.json": ('{"name": "ping", "x": ' + "[" * 20_000 + "]" * 20_000 + "}",
                       "over a limit at line 1, column 86: nested more than 64 levels"),
    "version.flow.yaml": ("name: ping\nversion: " + "1" * 5000 + "\ndescription: d\n"
                          "steps: [find_order]\n",
                          "over a limit at line 2, column 10: a number of 5000 characters"),
    "version.flow.json": ('{"name": "ping",\n"version": ' + "1" * 5000 + "}",
                          "over a limit at line 2, column 12: a number of 5000 characters"),
    "long_version.flow.yaml": ('name: ping\nversion: "1.' + "9" * 5000 + '.0"\n'
                               "description: d\nsteps: [find_order]\n",
                               "version: version '1.99999999999999999999999999999999999...' "
                               "is 5004 characters long; at most 256 are allowed"),
    "retry.flow.yaml": ("name: ping\ndescription: d\nsteps:\n  - find_order\n"
                        "  - tool: track_parcel\n    retry: {retry_on: [ConectionError]}\n",
                        "steps[1].retry.retry_on[0]: 'ConectionError' is not an exception "
                        "class (did you mean 'ConnectionError'?"),
}


@pytest.fixture(autouse=True)
def in_repository(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield


@pytest.mark.parametrize("name", sorted(BAD))
def test_inspect_reports_a_hostile_file_in_one_line(tmp_path: Path, name: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    text, problem = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    code = main(["inspect", str(path), "--tools", TOOLS])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.startswith(f"chainweaver: error: {path}: {problem}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "deep.flow.json"
    path.write_text(BAD["deep.flow.json"][0])
    done = subprocess.run([sys.executable, "-m", "chainweaver", "inspect", str(path),
                           "--tools", TOOLS], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.startswith(f"chainweaver: error: {path}: over a limit at line 1")
    assert done.stderr.count("\n") == 1
