"""`chainweaver serve` access flags: JWT auth, per-caller views, rate limits (in process
and in Redis), the audit log and the tools-only forms; and their usage errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from support.procs import STARTUP_TIMEOUT, free_port, stop, wait_until_listening
from support.tokens import AUDIENCE, ISSUER, KeyPair

from chainweaver.cli import main
from chainweaver.mcp import FixedWindowRateLimiter, FlowServer
from chainweaver.mcp.gate.audit_log import JsonlAuditLog
from chainweaver.mcp.gate.rate_limit import RedisRateLimiter

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "examples/flows"
TOOLS = "examples/flow_tools.py"
BIN = Path(sys.executable).parent
CHAINWEAVER = shutil.which("chainweaver", path=str(BIN)) or str(BIN / "chainweaver")
SERVE = ["serve", FLOWS, "--tools", TOOLS]


@pytest.fixture(autouse=True)
def in_repository(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[FlowServer]:
    servers: list[FlowServer] = []
    monkeypatch.setattr(FlowServer, "serve", lambda self, *a, **k: servers.append(self))
    return servers


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_limit_and_audit_flags_reach_the_gate(capsys: pytest.CaptureFixture[str],
                                              served: list[FlowServer], tmp_path: Path,
                                              redis_url: str) -> None:
    code, _ = run(capsys, *SERVE, "--rate-limit", "5", "--rate-window", "30",
                  "--audit-log", str(tmp_path / "audit.jsonl"))
    assert code == 0
    security = served[-1].security
    assert isinstance(security.rate_limiter, FixedWindowRateLimiter)
    assert (security.rate_limiter.limit, security.rate_limiter.window_seconds) == (5, 30)
    assert isinstance(security.audit_hook, JsonlAuditLog)
    code, _ = run(capsys, *SERVE, "--rate-limit", "7", "--rate-limit-redis", redis_url)
    limiter = served[-1].security.rate_limiter
    assert code == 0 and isinstance(limiter, RedisRateLimiter)
    assert (limiter.limit, limiter.window_seconds) == (7, 60)


@pytest.mark.anyio
async def test_tools_only_flags_add_the_resource_and_prompt_tools(
        capsys: pytest.CaptureFixture[str], served: list[FlowServer]) -> None:
    code, _ = run(capsys, *SERVE, "--expose-schemas", "--expose-prompts",
                  "--resources-as-tools", "--prompts-as-tools")
    assert code == 0
    async with Client(served[-1].fastmcp) as client:
        names = {tool.name for tool in await client.list_tools()}
    assert {"list_resources", "read_resource", "list_prompts", "get_prompt"} <= names


@pytest.mark.parametrize(("extra", "message"), [
    (["--auth-public-key", "key.pem"], "--auth-public-key only applies to --transport "
                                       "streamable-http"),
    (["--transport", "streamable-http", "--auth-issuer", ISSUER],
     "--auth-issuer need --auth-jwks-uri or --auth-public-key"),
    (["--transport", "streamable-http", "--auth-public-key", "{d}/key.pem",
      "--auth-jwks-uri", "https://issuer.test/jwks"],
     "give one of --auth-jwks-uri, --auth-public-key and --auth-token-file"),
    (["--transport", "streamable-http", "--auth-public-key", "{d}/not_a_key.pem"],
     "--auth-public-key {d}/not_a_key.pem: not a PEM public key"),
    (["--rate-window", "5"], "--rate-window and --rate-limit-redis need --rate-limit"),
    (["--audit-log", "{d}/missing/audit.jsonl"], "--audit-log {d}/missing/audit.jsonl: "
                                                 "cannot be opened"),
    (["--resources-as-tools"], "resources_as_tools needs expose_schemas=True"),
])
def test_access_flag_mistakes_are_one_line_errors(
        capsys: pytest.CaptureFixture[str], served: list[FlowServer], tmp_path: Path,
        extra: list[str], message: str) -> None:
    KeyPair().write_public(tmp_path / "key.pem")
    (tmp_path / "not_a_key.pem").write_text("hello\n")
    code, err = run(capsys, *SERVE, *[item.replace("{d}", str(tmp_path)) for item in extra])
    assert code != 0 and not served
    assert message.replace("{d}", str(tmp_path)) in err.strip().splitlines()[-1]


@pytest.mark.anyio
async def test_a_public_key_and_a_visible_claim_give_each_token_its_own_flows(
        tmp_path: Path) -> None:
    keys = KeyPair()
    key = keys.write_public(tmp_path / "key.pem")
    audit = tmp_path / "audit.jsonl"
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with open(tmp_path / "server.log", "w") as output:
        process = subprocess.Popen(
            [CHAINWEAVER, *SERVE, "--expose-schemas", "--transport", "streamable-http",
             "--port", str(port), "--auth-public-key", str(key), "--auth-issuer", ISSUER,
             "--auth-audience", AUDIENCE, "--visible-claim", "teams",
             "--audit-log", str(audit)],
            cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            seen: dict[str, Any] = {}
            for who, teams in (("sam", ["support-team"]), ("bea", "billing-team docs-team")):
                transport = StreamableHttpTransport(
                    url, headers={"Authorization": f"Bearer {keys.token(who, teams)}"})
                async with Client(transport) as client:
                    seen[who] = sorted(tool.name for tool in await client.list_tools())
                    index = json.loads((await client.read_resource(
                        "chainweaver://flows"))[0].text)
                    assert sorted(f["name"] for f in index["flows"]) == seen[who]
            refused = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                  headers={"Accept": "application/json, text/event-stream",
                                           "Authorization": "Bearer "
                                           + KeyPair().token("sam", ["support-team"])},
                                  timeout=STARTUP_TIMEOUT)
        finally:
            stop(process)
    assert seen == {"sam": ["order_status"], "bea": ["help_search", "order_total"]}
    assert refused.status_code == 401
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    callers = {event["caller_id"] for event in events if event["kind"] != "http"}
    assert callers == {"client-sam|sam", "client-bea|bea"}
    # The token signed by another key never reached the gate: the token check refused it,
    # and that refusal is on the audit trail too, with no caller.
    refusals = [(e["kind"], e["reason"], e["caller_id"]) for e in events
                if e["decision"] == "denied"]
    assert refusals == [("http", "unauthenticated", None)]


def test_a_visible_claim_without_tokens_warns_that_nobody_sees_a_flow(
        capsys: pytest.CaptureFixture[str], served: list[FlowServer]) -> None:
    code, err = run(capsys, *SERVE, "--visible-claim", "teams")
    assert code == 0 and len(served) == 1
    assert err.splitlines()[-1] == (
        "chainweaver: warning: --visible-claim teams without --auth-jwks-uri or "
        "--auth-public-key: no caller has the claim, so none sees a flow")
