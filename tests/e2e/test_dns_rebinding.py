"""DNS-rebinding protection on streamable HTTP, on the wire.

Real servers (`chainweaver serve` and the example server) in subprocesses on 127.0.0.1:
foreign Host and Origin headers are refused (421, 403), loopback ones with the bound
port are accepted, configured values are added; and the MCP conformance suite's
`dns-rebinding-protection` scenario passes against both servers. The conformance suite
is an npm package, installed on first use into `.cache/` (needs node and npm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from support.conformance import CONFORMANCE_TIMEOUT, conformance_command
from support.procs import STARTUP_TIMEOUT, free_port, stop, wait_until_listening

from chainweaver.mcp.gate.http_guard import HostOriginRules, matches

ROOT = Path(__file__).resolve().parents[2]
CHAINWEAVER = str(Path(sys.executable).parent / "chainweaver")
EXAMPLE = ROOT / "examples" / "mcp_flow_server.py"
SERVE = [CHAINWEAVER, "serve", "examples/flows", "--tools", "examples/flow_tools.py",
         "--transport", "streamable-http"]

# 0.1.13 is the newest release that runs on Node 20 (later ones need Node 22's
# fs.globSync); its dns-rebinding-protection scenario is the same as in 0.1.16.
SCENARIO_CHECKS = {"localhost-host-rebinding-rejected", "localhost-host-valid-accepted"}

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "rebinding-test", "version": "0"}}}


class Server:
    """A server process we started, and where it listens."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        with open(log, "w") as output:
            self.process = subprocess.Popen([*argv, "--port", str(self.port)], cwd=ROOT,
                                            stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(self.process, self.port)
        except BaseException:
            stop(self.process)
            raise

    def post(self, host: str | None = None, origin: str | None = None) -> int:
        """POST an initialize with these Host and Origin headers; the HTTP status."""
        headers = {"Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream"}
        if host is not None:
            headers["Host"] = host
        if origin is not None:
            headers["Origin"] = origin
        response = httpx2.post(self.url, content=json.dumps(INITIALIZE), headers=headers,
                               timeout=STARTUP_TIMEOUT)
        return response.status_code


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(SERVE, tmp_path_factory.mktemp("rebinding") / "server.log")
    yield server
    stop(server.process)


@pytest.fixture(scope="module")
def configured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server([*SERVE, "--allowed-host", "mcp.example.com:*",
                     "--allowed-origin", "https://app.example.com"],
                    tmp_path_factory.mktemp("rebinding") / "server.log")
    yield server
    stop(server.process)


# ------------------------------------------------------------------ plain HTTP


def test_loopback_host_and_origin_with_the_bound_port_are_accepted(
        default_server: Server) -> None:
    port = default_server.port
    assert default_server.post() == 200  # what a non-browser client sends
    for name in ("127.0.0.1", "localhost", "[::1]"):
        assert default_server.post(f"{name}:{port}", f"http://{name}:{port}") == 200, name
        assert default_server.post(f"{name}:{port}") == 200, name


@pytest.mark.parametrize(("host", "origin", "status"), [
    ("evil.example.com:{port}", "http://evil.example.com:{port}", 421),  # DNS rebinding
    ("evil.example.com:{port}", None, 421),
    ("127.0.0.1:{other}", None, 421),  # another port is another server
    ("127.0.0.1.evil.example.com:{port}", None, 421),
    ("", None, 421),
    (None, "http://evil.example.com:{port}", 403),
    (None, "http://localhost:{other}", 403),  # a page served by another local program
    (None, "https://127.0.0.1:{port}", 403),
    (None, "null", 403),
])
def test_foreign_host_or_origin_is_refused(default_server: Server, host: str | None,
                                           origin: str | None, status: int) -> None:
    fill = {"port": default_server.port, "other": default_server.port + 1}
    assert default_server.post(host and host.format(**fill),
                               origin and origin.format(**fill)) == status


def test_configured_hosts_and_origins_are_added_to_the_defaults(
        configured_server: Server) -> None:
    port = configured_server.port
    assert configured_server.post("mcp.example.com:443", "https://app.example.com") == 200
    assert configured_server.post("mcp.example.com:8443") == 200
    assert configured_server.post(f"127.0.0.1:{port}", f"http://localhost:{port}") == 200
    assert configured_server.post("mcp.example.com:443", "https://evil.example.com") == 403
    assert configured_server.post("evil.example.com:443") == 421


def test_the_example_server_takes_allowed_hosts_and_origins(tmp_path: Path) -> None:
    server = Server([sys.executable, str(EXAMPLE), "--transport", "streamable-http",
                     "--allowed-host", "books.example.com", "--allowed-origin",
                     "https://shop.example.com"], tmp_path / "server.log")
    try:
        assert server.post("books.example.com", "https://shop.example.com") == 200
        assert server.post(f"localhost:{server.port}") == 200
        assert server.post("books.example.com:8080") == 421
        assert server.post("books.example.com", "https://evil.example.com") == 403
    finally:
        stop(server.process)


def test_rules_for_other_binds() -> None:
    """Not served here: a test binds nothing beyond loopback."""
    open_bind = HostOriginRules.for_bind("0.0.0.0", 8000, None, None)
    assert open_bind.hosts is None  # clients reach it by names the server cannot know
    assert open_bind.origins == ()  # but no browser page may drive it
    named = HostOriginRules.for_bind("10.1.2.3", 8000, ("mcp.example.com",),
                                     ("https://app.example.com",))
    assert named == HostOriginRules(("mcp.example.com",), ("https://app.example.com",))
    everything = HostOriginRules.for_bind("127.0.0.1", 8000, ("*",), ("*",))
    assert everything == HostOriginRules(None, None)
    assert HostOriginRules.for_bind("::1", 80, None, None).hosts == (
        "127.0.0.1:80", "localhost:80", "[::1]:80", "127.0.0.1", "localhost", "[::1]")
    assert HostOriginRules.for_bind("127.0.0.2", 8000, None, None).hosts == (
        "127.0.0.1:8000", "localhost:8000", "[::1]:8000", "127.0.0.2:8000")
    assert HostOriginRules.for_bind("0:0::1", 0, None, None).origins == (
        "http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*", "http://[0:0::1]:*")
    assert matches("LOCALHOST:8000", ("localhost:8000",))
    assert not matches("localhost:8000x", ("localhost:*",))


@pytest.mark.anyio
@pytest.mark.parametrize(("bind", "host", "origin", "status"), [
    ("0.0.0.0", "anything.example:8000", None, 200),  # Host unchecked without a list
    ("0.0.0.0", "anything.example:8000", "http://anything.example:8000", 403),
    ("0.0.0.0", "mcp.example.com", "https://console.example.com", 200),
    ("10.1.2.3", "mcp.example.com", None, 200),
    ("127.0.0.1", "127.0.0.1:8000", "http://[::1]:8000", 200),
    ("127.0.0.1", "127.0.0.1:8000", "http://127.0.0.1", 403),
])
async def test_the_guard_in_process(bind: str, host: str, origin: str | None,
                                    status: int) -> None:
    """The same middleware without a socket, for binds a test must not open."""
    from starlette.responses import PlainTextResponse

    from chainweaver.mcp.gate.http_guard import HostOriginGuard

    async def endpoint(scope, receive, send) -> None:  # noqa: ANN001
        await PlainTextResponse("ok")(scope, receive, send)

    configured = ("https://console.example.com",) if bind != "127.0.0.1" else None
    rules = HostOriginRules.for_bind(bind, 8000, None, configured)
    transport = httpx2.ASGITransport(app=HostOriginGuard(endpoint, rules))
    headers = {"Host": host, **({"Origin": origin} if origin else {})}
    async with httpx2.AsyncClient(transport=transport) as client:
        response = await client.get(f"http://{host}/mcp", headers=headers)
    assert response.status_code == status


# ------------------------------------------------------------------ conformance suite


@pytest.fixture(scope="module")
def conformance() -> list[str]:
    """The command that runs the conformance suite, installed into .cache/ once."""
    return conformance_command("the plain HTTP tests in this file cover the same rules")


def run_scenario(command: list[str], url: str, output: Path) -> dict[str, str]:
    """Run the dns-rebinding-protection scenario; its checks' statuses by id."""
    completed = subprocess.run(
        [*command, "server", "--url", url, "--scenario", "dns-rebinding-protection",
         "--output-dir", str(output)],
        capture_output=True, text=True, timeout=CONFORMANCE_TIMEOUT,
        env={**os.environ, "NO_COLOR": "1"})
    (results,) = output.glob("*/checks.json")
    checks = {check["id"]: check["status"] for check in json.loads(results.read_text())}
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return checks


@pytest.mark.parametrize("target", ["chainweaver serve", "examples/mcp_flow_server.py"])
def test_conformance_dns_rebinding_protection_scenario_passes(
        conformance: list[str], tmp_path: Path, target: str) -> None:
    argv = SERVE if target == "chainweaver serve" else [
        sys.executable, str(EXAMPLE), "--transport", "streamable-http"]
    server = Server(argv, tmp_path / "server.log")
    try:
        checks = run_scenario(conformance, server.url, tmp_path / "results")
    finally:
        stop(server.process)
    assert checks == dict.fromkeys(SCENARIO_CHECKS, "SUCCESS")
