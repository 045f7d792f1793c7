"""`serve --watch` flags: checked like every flag, accepted and ignored by inspect.
(Serving with --watch: tests/e2e/test_live_transports.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from chainweaver.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def in_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def test_inspect_accepts_the_watch_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["inspect", "examples/flows", "--tools", "examples/flow_tools.py",
                 "--watch", "--watch-interval", "0.5"])
    assert code == 0 and "Exposed: 3 of 6 flows" in capsys.readouterr().out


@pytest.mark.parametrize("interval", ["0", "-1", "soon", "nan"])
def test_a_bad_watch_interval_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                               interval: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "examples/flows", "--tools", "examples/flow_tools.py", "--watch",
              "--watch-interval", interval])
    assert stopped.value.code == 2
    assert "--watch-interval" in capsys.readouterr().err
