"""What a server says of itself before a client connects: its server card and its
MCP registry entry (``server.json``).

Both are documents about one *view*: the primitives they name are exactly what that
caller's ``tools/list``, ``resources/list``, ``resources/templates/list`` and
``prompts/list`` show (:meth:`FlowProvider.card_primitives
<chainweaver.mcp.components.provider.FlowProvider.card_primitives>` builds them from
the same components). The card follows the server-card extension (SEP-2127, schema
``v1``): identity, one streamable-HTTP remote and the protocol versions served. The
extension leaves primitives to the protocol's lists, so they travel under the card's
``_meta`` (:data:`PRIMITIVES_KEY`), its extension point. The registry entry follows
the registry's ``server.json`` schema and names the view's primitives (names and URIs
only) under the registry's publisher-provided metadata.

Everything here is a pure function of its arguments: no server state, no caller.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CARD_SCHEMA = "https://static.modelcontextprotocol.io/schemas/v1/server-card.schema.json"
REGISTRY_SCHEMA = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
CARD_MEDIA_TYPE = "application/mcp-server-card+json"
# The card's path under the streamable-HTTP endpoint (``/mcp`` -> ``/mcp/server-card``).
CARD_SUFFIX = "/server-card"
PRIMITIVES_KEY = "chainweaver/primitives"
PUBLISHER_KEY = "io.modelcontextprotocol.registry/publisher-provided"
PROTOCOL_VERSIONS = ("2025-11-25", "2026-07-28")
DEFAULT_DESCRIPTION = "Governed, versioned ChainWeaver flows published as MCP tools."
# The card and the registry both cap these (characters).
MAX_DESCRIPTION = 100
MAX_TITLE = 100


@dataclass(frozen=True)
class ServerIdentity:
    """Who the server is, the same in every view: name (reverse-DNS), version, title
    and a one-line description."""

    name: str
    version: str
    title: str
    description: str

    @classmethod
    def of(cls, server_name: str, registry_name: str | None, version: str,
           instructions: str | None) -> ServerIdentity:
        """From the server's settings: ``Discovery.registry_name`` or
        ``chainweaver.local/<name>``, and the first line of ``instructions`` (cut to fit)
        as the description."""
        local = "".join(c if c.isalnum() or c in "._-" else "-" for c in server_name)
        description = DEFAULT_DESCRIPTION
        if instructions and instructions.strip():
            description = _fitted(instructions.strip().splitlines()[0], MAX_DESCRIPTION)
        return cls(registry_name or f"chainweaver.local/{local or 'chainweaver'}", version,
                   _fitted(server_name, MAX_TITLE), description)


def _fitted(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def bearer_header() -> dict[str, Any]:
    """The ``Authorization`` header a remote behind bearer-token auth asks for."""
    return {"name": "Authorization", "description": "A bearer token for this server.",
            "isRequired": True, "isSecret": True, "value": "Bearer {token}",
            "variables": {"token": {"description": "The access token.", "isRequired": True,
                                    "isSecret": True}}}


def server_card(identity: ServerIdentity, url: str, primitives: Mapping[str, Any], *,
                bearer: bool) -> dict[str, Any]:
    """The server card for one view: ``primitives`` is that view's lists."""
    remote: dict[str, Any] = {"type": "streamable-http", "url": url,
                              "supportedProtocolVersions": list(PROTOCOL_VERSIONS)}
    if bearer:
        remote["headers"] = [bearer_header()]
    return {"$schema": CARD_SCHEMA, "name": identity.name, "version": identity.version,
            "title": identity.title, "description": identity.description,
            "remotes": [remote], "_meta": {PRIMITIVES_KEY: dict(primitives)}}


def registry_entry(identity: ServerIdentity, primitives: Mapping[str, Any], *,
                   url: str | None = None, bearer: bool = False,
                   pypi: tuple[str, str] | None = None) -> dict[str, Any]:
    """The ``server.json`` for one view: a remote at ``url`` and/or a PyPI package
    ``(name, version)`` started over stdio; the view's primitive names and URIs under
    the publisher-provided metadata."""
    entry: dict[str, Any] = {"$schema": REGISTRY_SCHEMA, "name": identity.name,
                             "title": identity.title, "description": identity.description,
                             "version": identity.version}
    if pypi is not None:
        entry["packages"] = [{"registryType": "pypi", "identifier": pypi[0],
                              "version": pypi[1], "transport": {"type": "stdio"}}]
    if url is not None:
        remote: dict[str, Any] = {"type": "streamable-http", "url": url}
        if bearer:
            remote["headers"] = [bearer_header()]
        entry["remotes"] = [remote]
    entry["_meta"] = {PUBLISHER_KEY: {"chainweaver": names_of(primitives)}}
    return entry


def names_of(primitives: Mapping[str, Any]) -> dict[str, list[str]]:
    """The names (and URIs) in a view's primitives, without their schemas."""
    return {
        "tools": [tool["name"] for tool in primitives.get("tools", ())],
        "resources": [resource["uri"] for resource in primitives.get("resources", ())],
        "resourceTemplates": [template["uriTemplate"]
                              for template in primitives.get("resourceTemplates", ())],
        "prompts": [prompt["name"] for prompt in primitives.get("prompts", ())],
    }


def canonical(document: Any) -> bytes:
    """``document`` as compact JSON with sorted keys: one byte string per content."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def entity_tag(*parts: bytes) -> str:
    """A strong HTTP entity tag over ``parts`` (what the card is made of): the same
    content always gets the same tag, on every replica, and nothing else goes in."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return f'"{digest.hexdigest()[:32]}"'
