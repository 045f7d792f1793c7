"""List cursors that belong to a caller's view of a snapshot.

FastMCP numbers a list's pages by offset into the list it serves, which is the
caller's view of the request's snapshot. A cursor therefore carries a fingerprint of
the list it was cut from (the published names and versions in that caller's view):
a later page is served only from the same list, so a change outside the caller's
view never disturbs its paging (and tells it nothing), while a change inside it gets
-32602 "list again" rather than a page of a different list.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

import mcp_types
from mcp import MCPError

from chainweaver.mcp.gate.views import View

LIST_AGAIN = ("the published list changed since this cursor was issued; "
              "list again from the start")

# Set by the list handler wrapper for the length of one list request; the provider
# notes there the fingerprint of the list it served.
_LISTED: ContextVar[dict[str, str] | None] = ContextVar("chainweaver_listed", default=None)
# Keys the fingerprint, so a cursor that reaches someone else cannot be used to test
# guesses about which flows its caller sees.
_KEY = secrets.token_bytes(32)


def note_listed(kind: str, view: View, names: Callable[[], Iterable[str]]) -> None:
    """Record, for the list request being served, which list of ``kind`` the caller got
    (computed once per view and kind: views live as long as their snapshot)."""
    listed = _LISTED.get()
    if listed is None:
        return  # not a list request (FastMCP also lists to resolve some lookups)

    def digest() -> str:
        hashed = hashlib.blake2b(kind.encode(), key=_KEY, digest_size=16)
        for name in names():
            hashed.update(b"\0" + name.encode("utf-8", "surrogatepass"))
        return hashed.hexdigest()

    listed["fingerprint"] = view.cached(f"cursor:{kind}", digest)


def paged_by_view(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a list handler so its cursors carry the fingerprint of the caller's list."""

    async def paged(ctx: Any, params: Any) -> Any:
        issued = None
        if params is not None and params.cursor is not None:
            issued, inner = _split(params.cursor)
            params = params.model_copy(update={"cursor": inner})
        listed: dict[str, str] = {}
        token = _LISTED.set(listed)
        try:
            result = await handler(ctx, params)
        finally:
            _LISTED.reset(token)
        fingerprint = listed.get("fingerprint", "0")
        if issued is not None and issued != fingerprint:
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=LIST_AGAIN)
        if getattr(result, "next_cursor", None) is not None:
            result = result.model_copy(
                update={"next_cursor": f"{fingerprint}.{result.next_cursor}"})
        return result

    return paged


def _split(cursor: str) -> tuple[str, str]:
    issued, dot, inner = cursor.partition(".")
    if not dot or not issued or not all(c in "0123456789abcdef" for c in issued):
        raise MCPError(code=mcp_types.INVALID_PARAMS, message="Invalid cursor")
    return issued, inner
