"""Running the ``chainweaver`` command in process, as the CLI tests do."""

from __future__ import annotations

import pytest

from chainweaver.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``chainweaver ARGV...`` in this process: its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
