"""`--approval` and `--approval-timeout`: what `inspect` reports, and bad values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run

from chainweaver.cli import main

pytestmark = pytest.mark.usefixtures("in_repository")

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["tests/servers/runs", "--tools", "tests/servers/runs/run_tools.py",
        "--side-effects", "none,read,write"]


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


# ------------------------------------------------------------ request-state keys

def _key_file(tmp_path: Path, *lines: str, mode: int = 0o600) -> Path:
    path = tmp_path / "state-keys.txt"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(mode)
    return path


@pytest.mark.anyio
async def test_replicas_sharing_a_key_file_accept_each_others_approval_state(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """The question asked by one `serve`, answered on another: what stateless replicas
    behind a load balancer need. A replica without the file refuses the answer."""
    from fastmcp import Client
    from mcp import MCPError
    from support.mcp_client import raw_call

    from chainweaver.mcp import FlowServer
    from chainweaver.mcp.runs.approval import APPROVAL_KEY

    served: list[FlowServer] = []
    monkeypatch.setattr(FlowServer, "serve", lambda self, *a, **k: served.append(self))
    keys = _key_file(tmp_path, "# rotated in 2026-11", "a" * 64,
                     "an older key that still unseals, kept a while")
    for extra in (["--request-state-key-file", str(keys)],
                  ["--request-state-key-file", str(keys)], []):
        assert run(capsys, "serve", *ARGS, "--approval", "elicit", *extra)[0] == 0
    asking, answering, stranger = served
    call = {"name": "pay", "arguments": {}}

    async def never_asked(*args: object) -> None:
        raise AssertionError("2026-07-28 asks through input_required, not elicitation")

    async with Client(asking.fastmcp, elicitation_handler=never_asked) as client:
        first = await raw_call(client, call)
    assert first["resultType"] == "input_required"
    accept = {"action": "accept", "content": {"approve": True}}
    retry = {**call, "inputResponses": {APPROVAL_KEY: accept},
             "requestState": first["requestState"]}
    async with Client(stranger.fastmcp) as client:
        with pytest.raises(MCPError) as refused:
            await raw_call(client, retry)
    async with Client(answering.fastmcp) as client:
        done = await raw_call(client, retry)
    assert refused.value.error.code == -32602
    assert done.get("isError") is False, done


@pytest.mark.parametrize(("lines", "message"), [
    (["# only a comment", ""], "the file lists no keys"),
    (["b" * 40, "too-short-secret"], "line 2: a key needs at least 32 bytes"),
])
def test_a_bad_key_file_is_refused_without_echoing_keys(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str],
        message: str) -> None:
    keys = _key_file(tmp_path, *lines)
    code, _, err = run(capsys, "serve", *ARGS, "--approval", "elicit",
                       "--request-state-key-file", str(keys))
    assert code == 1 and message in err
    assert "too-short-secret" not in err and "b" * 40 not in err


def test_a_missing_key_file_is_refused(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    code, _, err = run(capsys, "serve", *ARGS, "--request-state-key-file",
                       str(tmp_path / "absent.txt"))
    assert code == 2 and "--request-state-key-file" in err and "no such file" in err


def test_a_key_file_readable_by_others_warns(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    from chainweaver.mcp import FlowServer

    monkeypatch.setattr(FlowServer, "serve", lambda self, *a, **k: None)
    keys = _key_file(tmp_path, "c" * 32, mode=0o644)
    code, _, err = run(capsys, "serve", *ARGS, "--request-state-key-file", str(keys))
    assert code == 0
    assert err.splitlines()[-1] == (f"chainweaver: warning: --request-state-key-file {keys} "
                                    f"is readable by other users (chmod 600 {keys})")
