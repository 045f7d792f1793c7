"""Running the ``chainweaver`` command in process, as the CLI tests do."""

from __future__ import annotations

import io
import subprocess
from contextlib import redirect_stderr, redirect_stdout

import pytest

from chainweaver.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``chainweaver ARGV...`` in this process: its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def completed(*argv: str) -> subprocess.CompletedProcess[str]:
    """``chainweaver ARGV...`` in this process, answered as ``subprocess.run`` answers
    for the installed command: the exit code (argparse's usage exits included), stdout
    and stderr. A test module that uses it keeps one test on the installed command."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else int(exited.code is not None)
    return subprocess.CompletedProcess(["chainweaver", *argv], code, out.getvalue(),
                                       err.getvalue())
