"""Server cards in tests: the vendored schemas, fetching a card through a FlowServer's
ASGI app (no port), and the names a card mentions."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jsonschema

from chainweaver.mcp import FlowServer
from chainweaver.mcp.publish.card import PRIMITIVES_KEY

SCHEMAS = Path(__file__).resolve().parent / "schemas"
CARD_PATH = "/mcp/server-card"
BASE_URL = "http://127.0.0.1:8000"


@cache
def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMAS / name).read_text())
    return loaded


def check_card(card: dict[str, Any]) -> None:
    """Raise unless ``card`` validates against the server-card extension's schema."""
    jsonschema.validate(card, schema("server-card.v1.schema.json"),
                        format_checker=jsonschema.FormatChecker())


def check_registry_entry(entry: dict[str, Any]) -> None:
    jsonschema.validate(entry, schema("registry-server.schema.json"))


def asgi_client(server: FlowServer) -> httpx.AsyncClient:
    """An HTTP client driving ``server``'s streamable-HTTP app in memory."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=server.http_app()),
                             base_url=BASE_URL)


def primitives(card: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = card["_meta"][PRIMITIVES_KEY]
    return found


def tool_names(card: dict[str, Any]) -> set[str]:
    return {tool["name"] for tool in primitives(card)["tools"]}


def prompt_names(card: dict[str, Any]) -> set[str]:
    return {prompt["name"] for prompt in primitives(card)["prompts"]}


def resource_uris(card: dict[str, Any]) -> set[str]:
    return {resource["uri"] for resource in primitives(card)["resources"]}
