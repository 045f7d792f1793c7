"""List pages that belong to a caller's view of a snapshot, served in O(page).

A list's items are the caller's view of the request's snapshot, sorted by name. A
cursor carries a fingerprint of that list (the published names and versions in the
caller's view) ahead of the position: a later page is served only from the same list,
so a change outside the caller's view never disturbs its paging (and tells it
nothing), while a change inside it gets -32602 "list again" rather than a page of a
different list.

With a page size, and nothing on the FastMCP server but the flows (no transform, no
component of another provider), the page is cut by the provider before any component
is built or converted: serving a page costs the page, not the catalogue. Otherwise
FastMCP's own handler pages the whole list, and the cursor still names the caller's
list.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable
from typing import Any

import mcp_types
from fastmcp import FastMCP
from fastmcp.server.dependencies import bind_request_context
from mcp import MCPError

from chainweaver.mcp.gate.admission import Admission, ListPage, admitted

LIST_AGAIN = ("the published list changed since this cursor was issued; "
              "list again from the start")
# Lists whose items the flow provider alone can page, by what they list.
PAGED_BY_PROVIDER = frozenset({"tools/list", "resources/list", "prompts/list"})
LISTED = {"tools/list": "tools", "resources/list": "resources", "prompts/list": "prompts",
          "resources/templates/list": "templates"}

# Keys the fingerprint, so a cursor that reaches someone else cannot be used to test
# guesses about which flows its caller sees.
_KEY = secrets.token_bytes(32)


def fingerprint(kind: str, names: Iterable[str]) -> str:
    """The fingerprint of one caller's list of ``kind`` (its items' names, in order)."""
    hashed = hashlib.blake2b(kind.encode(), key=_KEY, digest_size=16)
    for name in names:
        hashed.update(b"\0" + name.encode("utf-8", "surrogatepass"))
    return hashed.hexdigest()


def paged_by_view(handler: Callable[..., Any], server: FastMCP, method: str,
                  page_size: int | None, provider: object) -> Callable[..., Any]:
    """``method``'s list handler with cursors bound to the caller's list, and pages cut
    by ``provider`` (the flow provider) when it alone serves that list."""

    async def paged(ctx: Any, params: Any) -> Any:
        cursor = params.cursor if params is not None else None
        issued, inner = _split(cursor) if cursor is not None else (None, None)
        by_provider = page_size is not None and method in PAGED_BY_PROVIDER \
            and await _only_flows(server, provider, method)
        page = ListPage(LISTED.get(method, method),
                        offset=_offset(inner) if by_provider and inner else 0,
                        size=page_size if by_provider else None)
        # The request's admission starts here, with the page it asks for; the first
        # middleware pins its snapshot in the same record (same request: its session).
        with admitted(Admission(ctx.session, page=page)):
            if by_provider:
                result = await _serve_page(server, method, ctx)
            else:
                if inner is not None:
                    params = params.model_copy(update={"cursor": inner})
                result = await handler(ctx, params)
        if issued is not None and issued != page.fingerprint:
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=LIST_AGAIN)
        position = (str(page.offset + (page.size or 0)) if page.more else None) \
            if by_provider else getattr(result, "next_cursor", None)
        if position is not None:
            result = result.model_copy(update={"next_cursor": f"{page.fingerprint}.{position}"})
        return result

    return paged


async def _only_flows(server: FastMCP, provider: object, method: str) -> bool:
    """Whether ``method``'s list on ``server`` holds the flow provider's items alone."""
    if server.transforms:
        return False
    for other in server.providers:
        if other is provider:
            continue
        if method == "tools/list":
            found: Any = await other.list_tools()
        elif method == "resources/list":
            found = await other.list_resources()
        else:
            found = await other.list_prompts()
        if found:
            return False
    return True


async def _serve_page(server: FastMCP, method: str, ctx: Any) -> Any:
    """The page the request's admission asks for, through FastMCP's public list
    methods (so every middleware, the gate first, runs as for any list)."""
    with bind_request_context(ctx):
        if method == "tools/list":
            tools = await server.list_tools()
            return mcp_types.ListToolsResult(tools=[t.to_mcp_tool(name=t.name) for t in tools])
        if method == "resources/list":
            resources = await server.list_resources()
            return mcp_types.ListResourcesResult(
                resources=[r.to_mcp_resource(uri=str(r.uri)) for r in resources])
        prompts = await server.list_prompts()
        return mcp_types.ListPromptsResult(
            prompts=[p.to_mcp_prompt(name=p.name) for p in prompts])


def _split(cursor: str) -> tuple[str, str]:
    issued, dot, inner = cursor.partition(".")
    if not dot or not issued or not all(c in "0123456789abcdef" for c in issued):
        raise MCPError(code=mcp_types.INVALID_PARAMS, message="Invalid cursor")
    return issued, inner


def _offset(position: str) -> int:
    if not (position.isascii() and position.isdigit()) or len(position) > 12:
        raise MCPError(code=mcp_types.INVALID_PARAMS, message="Invalid cursor")
    return int(position)
