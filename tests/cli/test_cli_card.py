"""`chainweaver card` and `chainweaver server-json`: the card serve answers an anonymous
caller and the registry entry, from the same exposure decision as serve (every serve
option counts), validated against their schemas, printed or written to a file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fastmcp import Client
from support.cli import run
from support.server_card import check_card, check_registry_entry, tool_names

from chainweaver.cli.building import build_server
from chainweaver.cli.commands import build_parser

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("examples/flows", "--tools", "examples/flow_tools.py")
EXPOSED = {"help_search", "order_status", "order_total"}


@pytest.fixture(autouse=True)
def at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_card_prints_the_anonymous_card_serve_would_answer(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "card", *SOURCES, "--expose-schemas",
                       "--url", "https://mcp.acme.test/mcp")
    assert code == 0
    card = json.loads(out)
    check_card(card)
    assert tool_names(card) == EXPOSED
    assert card["remotes"][0]["url"] == "https://mcp.acme.test/mcp"
    # serve's options narrow it as they narrow serve: an owner filter, a prefix.
    code, out, _ = run(capsys, "card", *SOURCES, "--owner", "support-team",
                       "--prefix", "acme", "--transport", "streamable-http", "--port", "9100")
    card = json.loads(out)
    assert tool_names(card) == {"acme__order_status"}
    assert card["remotes"][0]["url"] == "http://127.0.0.1:9100/mcp"


def test_card_names_nothing_when_serve_would_want_a_token(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("secret-token-1\n")
    tokens.chmod(0o600)
    code, out, _ = run(capsys, "card", *SOURCES, "--transport", "streamable-http",
                       "--auth-token-file", str(tokens))
    assert code == 0
    card = json.loads(out)
    check_card(card)
    assert tool_names(card) == set()
    assert "secret-token-1" not in out
    assert not any(name in out for name in EXPOSED)


def test_server_json_writes_a_registry_entry(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    target = tmp_path / "server.json"
    code, out, err = run(capsys, "server-json", *SOURCES, "--registry-name",
                         "io.github.acme/support", "--url", "https://mcp.acme.test/mcp",
                         "--pypi", "acme-support==1.4.0", "--output", str(target))
    assert (code, out) == (0, "")
    assert "wrote the registry entry" in err
    entry = json.loads(target.read_text())
    check_registry_entry(entry)
    assert entry["name"] == "io.github.acme/support"
    assert entry["packages"][0]["version"] == "1.4.0"
    assert set(entry["_meta"]["io.modelcontextprotocol.registry/publisher-provided"][
        "chainweaver"]["tools"]) == EXPOSED


@pytest.mark.anyio
async def test_registry_name_and_cache_ttl_reach_the_server_serve_builds() -> None:
    args = build_parser().parse_args(["serve", *SOURCES, "--registry-name",
                                      "io.github.acme/desk", "--cache-ttl", "30"])
    server = build_server(args).server
    assert server.registry_entry(url="https://mcp.acme.test/mcp", pypi=None)["name"] == \
        "io.github.acme/desk"
    async with Client(server.fastmcp) as client:  # negotiates 2026-07-28
        listed = await client.list_tools_mcp()
    assert (listed.ttl_ms, listed.cache_scope) == (30_000, "public")


@pytest.mark.parametrize(("argv", "message"), [
    (("server-json", *SOURCES), "needs --registry-name"),
    (("server-json", *SOURCES, "--registry-name", "no-slash"), "registry_name"),
    (("server-json", *SOURCES, "--registry-name", "a.b/c", "--pypi", "pkg"), "NAME==VERSION"),
    (("card", *SOURCES, "--url", "ftp://x/mcp"), "--url"),
])
def test_bad_options_get_one_clear_line(capsys: pytest.CaptureFixture[str],
                                        argv: tuple[str, ...], message: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code != 0 and out == ""
    assert message in err and "Traceback" not in err


@pytest.mark.tasks  # the governance store needs the Redis client (the tasks extra)
@pytest.mark.parametrize("command", ["card", "server-json"])
def test_documents_name_nothing_the_shared_governance_withdrew(
        capsys: pytest.CaptureFixture[str], redis_url: str, command: str) -> None:
    """With --governance, the card and the registry entry are built from the state
    every replica applies (as serve applies it before its first request): a flow an
    operator withdrew or archived is not named, and a state that cannot be read prints
    nothing (exit 3) rather than a document that might name one."""
    import asyncio
    import uuid

    from chainweaver.governance import GovernanceStore

    prefix = f"test:card:{uuid.uuid4().hex}"
    options = ["--registry-name", "io.github.acme/desk"] if command == "server-json" else []
    argv = [command, *SOURCES, *options, "--governance", redis_url,
            "--governance-prefix", prefix]

    async def decide() -> None:
        store = GovernanceStore(redis_url, prefix)
        try:
            await store.change("order_status", None, "withdrawn", by="ops")
            await store.change("order_total", None, "archived", by="ops")
        finally:
            await store.aclose()

    def names(document: str) -> set[str]:
        found = json.loads(document)
        if command == "card":
            check_card(found)
            return tool_names(found)
        return set(found["_meta"]["io.modelcontextprotocol.registry/publisher-provided"][
            "chainweaver"]["tools"])

    code, out, _ = run(capsys, *argv)
    assert code == 0 and names(out) == EXPOSED  # nothing decided yet
    asyncio.run(decide())
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert names(out) == {"help_search"}
    assert "order_status" not in out and "order_total" not in out
    unreachable = [*argv[:-4], "--governance", "redis://127.0.0.1:1/0"]
    code, out, err = run(capsys, *unreachable)
    assert (code, out) == (3, "")
    assert "cannot read the governance state at redis://127.0.0.1:1/0" in err
