"""DNS-rebinding protection for streamable HTTP: which Host and Origin headers are accepted.

A web page can make a browser send requests to a server on 127.0.0.1 by giving its own
domain name a loopback address (DNS rebinding). The browser then sends the attacker's
name in ``Host`` and the attacker's page in ``Origin``, so checking both stops it.

The rules follow the MCP SDK's ``TransportSecuritySettings``: exact values, or
``name:*`` for any port; 421 for a bad Host, 403 for a bad Origin, as the MCP
specification asks. Neither ready-made guard fits: FastMCP's ignores ports and accepts
every loopback Origin on a loopback bind (so a page served by another local program on
another port gets through), and FastMCP switches the SDK's check off inside its
transport. Hence this small middleware, put in front of the MCP endpoint by
``FlowServer.serve_async``.

It also audits what is refused before any MCP request is read, so a failed login is on
the audit trail like every other refusal: its own refusals (``invalid_host``,
``invalid_origin``) and the token check's (401: ``unauthenticated``; 403:
``insufficient_scope``; each with a Bearer challenge), as ``kind="http"`` events naming
the request's path.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chainweaver.mcp.hooks import AuditEvent, AuditHook, deliver_audit

logger = logging.getLogger("chainweaver.mcp.http")

ANY = "*"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# What the token check in front of the MCP endpoint refuses with, as audit reasons.
REFUSED_BY_AUTH = {401: "unauthenticated", 403: "insufficient_scope"}


def is_loopback(host: str) -> bool:
    """Whether a bind address or host name only ever reaches this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HostOriginRules:
    """The Host and Origin values one listening server accepts; ``None``: that header
    is not checked. A request without an ``Origin`` header (any non-browser client)
    passes the Origin check either way."""

    hosts: tuple[str, ...] | None
    origins: tuple[str, ...] | None

    @classmethod
    def for_bind(cls, host: str, port: int, allowed_hosts: tuple[str, ...] | None,
                 allowed_origins: tuple[str, ...] | None) -> HostOriginRules:
        """The rules for a server bound to ``host:port`` (see ``docs/security.md``).

        Loopback bind: the loopback names with the bound port, plus what is configured.
        Other binds: only what is configured; the Host is then unchecked unless
        ``allowed_hosts`` is set, and a request carrying an Origin is refused unless
        ``allowed_origins`` lists it. ``"*"`` in a list switches that check off.
        """
        defaults_hosts: tuple[str, ...] = ()
        defaults_origins: tuple[str, ...] = ()
        if is_loopback(host):
            names = tuple(dict.fromkeys((*LOOPBACK_NAMES, _as_host_header(host))))
            # Port 0 lets the OS choose, so the port a client uses is not known here.
            suffix = ":*" if port == 0 else f":{port}"
            defaults_hosts = tuple(name + suffix for name in names)
            if port == 80:  # a browser leaves the default port out of Host and Origin
                defaults_hosts += names
            defaults_origins = tuple(f"http://{name}" for name in defaults_hosts)
        hosts = _merge(defaults_hosts, allowed_hosts)
        origins = _merge(defaults_origins, allowed_origins)
        if hosts == () and allowed_hosts is None:
            hosts = None  # a non-loopback bind with no list: clients use any name
        return cls(hosts, origins)

    def middleware(self, audit_hook: AuditHook | None = None,
                   hook_timeout: float = 5.0) -> Middleware:
        """The Starlette middleware that enforces these rules (and, with ``audit_hook``,
        audits the HTTP requests refused before the MCP endpoint reads them)."""
        return Middleware(HostOriginGuard, rules=self, audit_hook=audit_hook,
                          hook_timeout=hook_timeout)


def _as_host_header(host: str) -> str:
    """A bind address as it appears in a Host header: IPv6 in brackets, lower case."""
    name = host.strip().strip("[]").lower()
    return f"[{name}]" if ":" in name else name


def _merge(defaults: tuple[str, ...], configured: tuple[str, ...] | None
           ) -> tuple[str, ...] | None:
    if configured is not None and ANY in configured:
        return None
    return tuple(dict.fromkeys((*defaults, *(configured or ()))))


class HostOriginGuard:
    """ASGI middleware: refuse HTTP requests whose Host or Origin is not accepted.

    Host first (421 Misdirected Request), then Origin (403 Forbidden), the codes the
    MCP SDK's own check and the MCP specification use. A request without an Origin
    header is not a browser's cross-site request and passes that check. With an
    ``audit_hook``, each refusal, its own and the token check's behind it, is audited.
    """

    def __init__(self, app: ASGIApp, rules: HostOriginRules,
                 audit_hook: AuditHook | None = None, hook_timeout: float = 5.0) -> None:
        self.app = app
        self.rules = rules
        self.audit_hook = audit_hook
        self.hook_timeout = hook_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(Headers(scope=scope))
        if refusal is not None:
            response, reason = refusal
            logger.info("refused an HTTP request: %s", bytes(response.body).decode())
            await self._audit(scope, reason)
            await response(scope, receive, send)
            return
        if self.audit_hook is None:
            await self.app(scope, receive, send)
            return

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                reason = REFUSED_BY_AUTH.get(message["status"])
                # The token check's refusals carry a Bearer challenge; a 403 without
                # one (the server card's gate refusal) was audited by the gate.
                if reason is not None and Headers(raw=message.get("headers", [])).get(
                        "www-authenticate") is not None:
                    await self._audit(scope, reason)
            await send(message)

        await self.app(scope, receive, watched)

    def _refusal(self, headers: Headers) -> tuple[Response, str] | None:
        hosts, origins = self.rules.hosts, self.rules.origins
        if hosts is not None and not matches(headers.get("host", ""), hosts):
            return Response("Invalid Host header", status_code=421), "invalid_host"
        origin = headers.get("origin")
        if origin is not None and origins is not None and not matches(origin, origins):
            return Response("Invalid Origin header", status_code=403), "invalid_origin"
        return None

    async def _audit(self, scope: Scope, reason: str) -> None:
        if self.audit_hook is None:
            return
        event = AuditEvent(timestamp=time.time(), phase="decision", kind="http",
                           name=scope.get("path", ""), flow_name=None, flow_version=None,
                           caller_id=None, decision="denied", reason=reason)
        await deliver_audit(self.audit_hook, event, self.hook_timeout)


def matches(value: str, accepted: tuple[str, ...]) -> bool:
    """``value`` is one of ``accepted``, where ``"name:*"`` stands for any port of
    ``name`` (the rule of the MCP SDK's ``TransportSecuritySettings``). Case-insensitive,
    as host names and URL schemes are."""
    value = value.strip().lower()
    if not value:
        return False
    for pattern in accepted:
        pattern = pattern.lower()
        if value == pattern:
            return True
        if pattern.endswith(":*") and value.startswith(pattern[:-1]) and \
                value[len(pattern) - 1:].isdigit():
            return True
    return False
