"""``chainweaver flows`` without a Redis to talk to: the password in the URL is never
printed (masked as ``chainweaver runs`` masks it), the store and the reason are, and
what the command does not know (an action, a version) is refused before anything is
written."""

from __future__ import annotations

import pytest
from support.cli import run

from chainweaver.cli.errors import EXIT_INVALID, EXIT_MISSING

SECRET = "s3cret-pw"


@pytest.mark.parametrize("url", [f"redis://:{SECRET}@127.0.0.1:1/0",
                                 f"redis://ops:{SECRET}@127.0.0.1:1/0",
                                 f"redis://127.0.0.1:1/0?password={SECRET}"])
@pytest.mark.parametrize("command", [["status"], ["status", "--json"],
                                     ["archive", "orders", "--wait", "1"]])
def test_an_unreachable_redis_is_named_with_its_password_masked(
        capsys: pytest.CaptureFixture[str], url: str, command: list[str]) -> None:
    code, out, err = run(capsys, "flows", *command, "--governance", url)
    assert code == EXIT_MISSING
    assert SECRET not in out + err
    assert "cannot reach the governance state at redis://" in err and "***" in err
    assert "ConnectionError" in err and "127.0.0.1" in err  # the reason


def test_the_environment_url_is_masked_too(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINWEAVER_GOVERNANCE", f"redis://:{SECRET}@127.0.0.1:1/0")
    code, _, err = run(capsys, "flows", "status")
    assert code == EXIT_MISSING and SECRET not in err
    assert "redis://:***@127.0.0.1:1/0" in err


def test_a_url_that_is_not_redis_is_refused_with_its_password_masked(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "flows", "status", "--governance",
                       f"http://ops:{SECRET}@127.0.0.1:1/0")
    assert code == EXIT_INVALID and SECRET not in err
    assert "got 'http://ops:***@127.0.0.1:1/0'" in err


def test_an_action_or_version_it_does_not_know_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse: not a verb of flows
        run(capsys, "flows", "pause", "orders", "--governance", "redis://127.0.0.1:1/0")
    assert exited.value.code == 2 and "invalid choice: 'pause'" in capsys.readouterr().err
    code, _, err = run(capsys, "flows", "archive", "orders", "--version", "1.0 final",
                       "--governance", "redis://127.0.0.1:1/0")
    assert code == EXIT_INVALID and "neither a PEP 440 nor a semver" in err
