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

Without a page size a list is one message, unless it would not reach a standard client
(above :data:`~chainweaver.mcp.gate.body_cap.MESSAGE_BUDGET` as sent): then it is cut
by its size, each page as many items as fit, and the next cursor says where the next
page starts. With nothing on the FastMCP server but the flows, the provider cuts it
(:func:`fitting`), building and measuring only the page's components; otherwise each
such page is cut from the whole list.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import mcp_types
from fastmcp import FastMCP
from fastmcp.server.dependencies import bind_request_context
from fastmcp.server.providers import LocalProvider
from mcp import MCPError

from chainweaver.mcp.gate.admission import ListPage, admitted, list_request
from chainweaver.mcp.gate.body_cap import MESSAGE_BUDGET

T = TypeVar("T")

LIST_AGAIN = ("the published list changed since this cursor was issued; "
              "list again from the start")
INVALID_CURSOR = "Invalid cursor"
# Lists whose items the flow provider alone can page, by what they list.
PAGED_BY_PROVIDER = frozenset({"tools/list", "resources/list", "prompts/list"})
LISTED = {"tools/list": "tools", "resources/list": "resources", "prompts/list": "prompts",
          "resources/templates/list": "templates"}

# The ListPage.size of a list the flow provider cuts by its size, from the position in
# the page's cursor (it alone holds the list's items): it builds and measures only the
# components of the page that fits, not the catalogue's, and says in the page's
# offset, size and more where it cut.
BY_SIZE = 0

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
                  page_size: int | None, provider: Any) -> Callable[..., Any]:
    """``method``'s list handler with cursors bound to the caller's list, and pages cut
    by ``provider`` (the flow provider) when it alone serves that list."""

    async def paged(ctx: Any, params: Any) -> Any:
        cursor = params.cursor if params is not None else None
        issued, inner = _split(cursor) if cursor is not None else (None, None)
        by_provider = page_size is not None and method in PAGED_BY_PROVIDER \
            and await _only_flows(server, provider, method)
        # No page size: a list is cut by its size only, from the whole list.
        by_size = page_size is None and method in PAGED_BY_PROVIDER
        # Cut by the provider, which builds and measures only the items that fit.
        provider_cuts = by_size and await _only_flows(server, provider, method)
        start = 0
        if by_size and inner is not None:
            start, inner = position(inner), None
            if start < 0:
                issued = None  # refused below, as any cursor not of ours
        page = ListPage(LISTED.get(method, method), provider.owner,
                        cursor=str(start) if provider_cuts else inner, issued=issued,
                        size=page_size if by_provider else BY_SIZE if provider_cuts
                        else None)
        if cursor is not None and issued is None:
            # Not a cursor of ours: refused by the gate, as it serves the list.
            page.refused = INVALID_CURSOR
        # The request's admission starts here, with the page it asks for; the gate's
        # first step pins its snapshot in the same record (same request: its session).
        # The provider checks the cursor inside the gate (see FlowProvider._page).
        with admitted(list_request(ctx.session, page)):
            if by_provider:
                result = await _serve_page(server, method, ctx)
            else:
                if inner is not None or by_size and cursor is not None:
                    params = params.model_copy(update={"cursor": inner})
                result = await handler(ctx, params)
        page.check()  # refused while no gate served it (a server without its own gate)
        if issued is not None and issued != page.fingerprint:
            # A list no provider fingerprinted (the schema template's) has no pages.
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=LIST_AGAIN)
        if provider_cuts:
            following = str(page.offset + (page.size or 0)) if page.more else None
        elif by_size:
            result, following = _cut_by_size(result, LISTED[method], start)
        else:
            following = (str(page.offset + (page.size or 0)) if page.more else None) \
                if by_provider else getattr(result, "next_cursor", None)
        if following is not None:
            fingerprinted = page.fingerprint or "0"
            result = result.model_copy(update={"next_cursor": f"{fingerprinted}.{following}"})
        return result

    return paged


async def _only_flows(server: FastMCP, provider: object, method: str) -> bool:
    """Whether ``method``'s list on ``server`` holds the flow provider's items alone:
    no transform, and no provider beside it but FastMCP's own (for components added
    with its decorators) holding none of that kind. Any other provider (a mounted
    server's) may list differently for each caller, so it is never asked here."""
    if server.transforms:
        return False
    for other in server.providers:
        if other is provider:
            continue
        if not isinstance(other, LocalProvider):
            return False
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


def _cut_by_size(result: Any, field: str, start: int) -> tuple[Any, str | None]:
    """The page of ``result`` (a whole list) from ``start`` that fits one message as
    sent, at least one item, and where the next page starts (None: no more)."""
    items = getattr(result, field)
    if start >= len(items) and start > 0:
        raise MCPError(code=mcp_types.INVALID_PARAMS, message=LIST_AGAIN)
    end = fitting(items, start, sent_size)
    if start == 0 and end == len(items):
        return result, None
    following = str(end) if end < len(items) else None
    return result.model_copy(update={field: items[start:end]}), following


def fitting(items: Sequence[T], start: int, size: Callable[[T], int]) -> int:
    """Where the page of ``items`` from ``start`` that fits one message as sent ends
    (at least one item), each item's bytes given by ``size`` (asked once an item, and
    not past the first item that does not fit)."""
    end, used = start, 0
    while end < len(items):
        used += size(items[end]) + 1  # and its comma
        if used > MESSAGE_BUDGET and end > start:
            break
        end += 1
    return end


def sent_size(item: Any) -> int:
    """An item's bytes as sent (every character outside ASCII escaped, as the
    2026-07-28 transport sends it)."""
    text = item.model_dump_json(by_alias=True, exclude_none=True)
    return len(text) if text.isascii() else len(json.dumps(json.loads(text)))


def _split(cursor: str) -> tuple[str | None, str | None]:
    """A cursor's fingerprint and position (None, None: not a cursor of ours)."""
    issued, dot, inner = cursor.partition(".")
    if not dot or not issued or not all(c in "0123456789abcdef" for c in issued):
        return None, None
    return issued, inner


def position(cursor: str) -> int:
    """The offset a cursor's position names (-1: it names none)."""
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 12:
        return -1
    return int(cursor)
