"""What is refused before an MCP request is read is on the audit trail too: a failed
login (no token, a wrong one: 401 from the token check) and a foreign Host or Origin
(421, 403 from the DNS-rebinding guard), as ``kind="http"`` decisions naming the path,
with no caller. Through ``chainweaver serve --auth-token-file --audit-log`` on 127.0.0.1.
A server without an audit log refuses the same way."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.procs import STARTUP_TIMEOUT, free_port, stop, wait_until_listening

ROOT = Path(__file__).resolve().parents[2]
CHAINWEAVER = str(Path(sys.executable).parent / "chainweaver")
TOKEN = "tok-audited-5c1e"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "refusal-audit-test", "version": "0"}}}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("http-refusals")
    tokens = directory / "tokens.txt"
    tokens.write_text(f"# one token\n{TOKEN}\n")
    tokens.chmod(0o600)
    audit = directory / "audit.jsonl"
    port = free_port()
    with open(directory / "server.log", "w") as output:
        process = subprocess.Popen(
            [CHAINWEAVER, "serve", "examples/flows", "--tools", "examples/flow_tools.py",
             "--transport", "streamable-http", "--port", str(port),
             "--auth-token-file", str(tokens), "--audit-log", str(audit)],
            cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until_listening(process, port)
        yield {"url": f"http://127.0.0.1:{port}/mcp", "port": port, "audit": audit}
    finally:
        stop(process)


def post(url: str, **headers: str) -> int:
    sent = {"Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", **headers}
    response = httpx2.post(url, content=json.dumps(INITIALIZE), headers=sent,
                           timeout=STARTUP_TIMEOUT)
    return response.status_code


def audited(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_failed_logins_and_foreign_hosts_are_audited(served: dict[str, Any]) -> None:
    url, port = served["url"], served["port"]
    assert post(url) == 401  # no token
    assert post(url, Authorization="Bearer not-the-token") == 401
    assert post(url, Authorization=f"Bearer {TOKEN}", Host="evil.example.com") == 421
    assert post(url, Authorization=f"Bearer {TOKEN}", Host=f"127.0.0.1:{port}",
                Origin="http://evil.example.com") == 403
    assert post(url, Authorization=f"Bearer {TOKEN}") == 200
    events = [event for event in audited(served["audit"]) if event["kind"] == "http"]
    assert [event["reason"] for event in events] == \
        ["unauthenticated", "unauthenticated", "invalid_host", "invalid_origin"]
    for event in events:
        assert (event["phase"], event["decision"], event["name"]) == \
            ("decision", "denied", "/mcp")
        assert event["caller_id"] is None and event["flow_name"] is None
    assert not any(TOKEN in line or "not-the-token" in line
                   for line in served["audit"].read_text().splitlines())


def test_a_long_hostile_path_is_bounded_in_the_audit(served: dict[str, Any]) -> None:
    before = len(audited(served["audit"]))
    url = f"http://127.0.0.1:{served['port']}/" + "x" * 5000
    assert post(url, Host="evil.example.com") == 421  # the guard sees every path
    (event,) = audited(served["audit"])[before:]
    assert event["reason"] == "invalid_host"
    assert len(event["name"]) == 256 and event["name"].startswith("/xxx")
    assert "5001 chars, sha256:" in event["name"]
