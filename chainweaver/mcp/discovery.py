"""The server card over streamable HTTP: ``GET <endpoint>/server-card``.

A card request is admitted like a list: the bearer token the server's ``auth``
verifies (or the ``authenticator`` hook) names the caller, the rate limiter counts it
(as ``server-card``) and the audit hook records it. The card names what that caller's
lists show, from the snapshot current when the request arrived; a caller the server
would not let list anything (no token where ``auth`` wants one, or an authenticator
that knows nobody) gets the card with no primitives. A token the server's ``auth``
rejects gets 401, as an MCP request would.

The entity tag is a digest of the card itself, so it changes exactly when what the
caller may see changes (or the server's identity does) and never because of a flow
outside the view; ``If-None-Match`` with the current tag answers 304. Caching headers
follow the same rule as the lists' 2026-07-28 hints (:mod:`.gate.cache_hints`):
``private`` whenever the card depends on who asks, for at most ``Discovery.cache_ttl``
seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.transforms import Transform
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.admission import token_caller
from chainweaver.mcp.gate.cache_hints import CachePolicy
from chainweaver.mcp.gate.security import GateRefused, SecurityGate
from chainweaver.mcp.gate.views import Views
from chainweaver.mcp.hooks import ANONYMOUS, CallerIdentity, GateContext
from chainweaver.mcp.publish.card import (
    CARD_MEDIA_TYPE,
    CARD_SUFFIX,
    PRIMITIVES_KEY,
    ServerIdentity,
    canonical,
    entity_tag,
    registry_entry,
    server_card,
)
from chainweaver.mcp.publish.live_exposure import LiveExposure

logger = logging.getLogger("chainweaver.mcp.discovery")

CARD_NAME = "server-card"  # what the rate limiter and the audit call a card request
NO_PRIMITIVES: dict[str, list[Any]] = {"tools": [], "resources": [], "resourceTemplates": [],
                                       "prompts": []}
_CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "GET",
         "Access-Control-Allow-Headers": "Authorization, Content-Type, If-None-Match",
         "Access-Control-Expose-Headers": "ETag"}


@dataclass
class ServerCards:
    """Builds each caller's card and serves it (see the module doc)."""

    identity: ServerIdentity
    live: LiveExposure
    views: Views
    gate: SecurityGate
    # (a view, the server's transforms) -> what that view's lists show
    primitives: Callable[[Any, Sequence[Transform]], Mapping[str, Any]]
    auth: Any  # the server's FastMCP AuthProvider, or None
    cache: CachePolicy
    server: FastMCP  # whose transforms (a Namespace...) name what its lists show
    _routes: set[str] = field(default_factory=set)

    def install(self, fastmcp: FastMCP, path: str) -> None:
        """Serve the card at ``<path>/server-card`` (once per path)."""
        route = path.rstrip("/") + CARD_SUFFIX
        if route not in self._routes:
            self._routes.add(route)
            fastmcp.custom_route(route, ["GET", "OPTIONS"], include_in_schema=False)(
                self.endpoint)

    def anonymous_card(self, url: str) -> dict[str, Any]:
        """The card a caller without credentials gets."""
        return self.card(None if self.auth is not None else ANONYMOUS, url)[0]

    def registry_entry(self, url: str | None, pypi: tuple[str, str] | None
                       ) -> dict[str, Any]:
        """The ``server.json`` naming what an anonymous caller may list."""
        card = self.anonymous_card(url or "http://127.0.0.1:8000/mcp")
        return registry_entry(self.identity, card["_meta"][PRIMITIVES_KEY], url=url,
                              bearer=self.auth is not None, pypi=pypi)

    def card(self, caller: CallerIdentity | None, url: str) -> tuple[dict[str, Any], str]:
        """The card of ``caller``'s view (None: a caller who may list nothing) with
        its remote at ``url``, and its entity tag."""
        record = admission.pinned(self, self.live)
        assert record is not None
        with admission.admitted(record):
            if caller is None:
                primitives: Mapping[str, Any] = NO_PRIMITIVES
            else:
                view = self.views.of(self.live, caller)
                # Read at each card: a transform added after the server was built
                # renames the card's names as it renames the lists'.
                transforms = tuple(self.server.transforms)
                key = "card:primitives " + " ".join(str(id(t)) for t in transforms)
                primitives = view.cached(key, lambda: self.primitives(view, transforms))
        card = server_card(self.identity, url, primitives, bearer=self.auth is not None)
        return card, entity_tag(canonical(card))

    async def endpoint(self, request: Request) -> Response:
        """``GET`` (and the browser's ``OPTIONS``) on ``<endpoint>/server-card``."""
        if request.method == "OPTIONS":
            return Response(status_code=204, headers=_CORS)
        try:
            caller = await self._caller(request)
        except _Unauthorized:
            return Response(status_code=401, headers={
                **_CORS, "WWW-Authenticate": 'Bearer error="invalid_token"'})
        except GateRefused as refused:
            status = 429 if refused.reason == "rate_limited" else 403
            return JSONResponse({"error": refused.reason}, status_code=status, headers=_CORS)
        # The endpoint the request reached (the card's own path and any query dropped).
        url = str(request.url.replace(query="", fragment="")).rstrip("?").removesuffix(
            CARD_SUFFIX)
        card, tag = self.card(caller, url)
        headers = {**_CORS, "ETag": tag, "Vary": "Authorization",
                   "Cache-Control": self.cache.cache_control()}
        tags = _tags(request.headers.get("if-none-match", ""))
        if tag in tags or "*" in tags:
            return Response(status_code=304, headers=headers)
        return Response(canonical(card), media_type=CARD_MEDIA_TYPE, headers=headers)

    async def _caller(self, request: Request) -> CallerIdentity | None:
        """The caller the gate admits the request as; None: one who may list nothing."""
        token = _bearer(request.headers.get("authorization"))
        caller: CallerIdentity | None = ANONYMOUS
        if self.auth is not None:
            if token is None:
                caller = None  # the MCP endpoint would answer 401: nothing to list
            else:
                try:
                    verified = await self.auth.verify_token(token)
                except Exception as error:  # a verifier that fails refuses; never a 500
                    logger.warning("server card: token verification raised %s",
                                   type(error).__name__)
                    verified = None
                if verified is None:
                    raise _Unauthorized
                caller = token_caller(verified)
        if not self.gate.active:
            return caller
        context = GateContext("list", CARD_NAME, None, None, dict(request.headers))
        return await self.gate.admit_outside_mcp(context, caller)


class _Unauthorized(Exception):
    pass


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _tags(header: str) -> set[str]:
    """The entity tags an ``If-None-Match`` header lists (``*``: any)."""
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}
