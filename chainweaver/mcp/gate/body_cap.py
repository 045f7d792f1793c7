"""The byte cap on what one rendered prompt or resource read returns
(``ServingConfig.max_body_bytes``).

:class:`BodyCap` (a middleware right after the gate) measures the body an admitted
prompt or read produced before it leaves the server: text as UTF-8, blobs as their
bytes. Above the cap the request gets -32602 naming the cap (never the content), and
the gate audits it as refused (``body_too_large``).
Ranged reads of a run's output are measured per response, so an output above the cap
is read in ranges of at most the cap.
"""

from __future__ import annotations

from typing import Any

from fastmcp.server.middleware import Middleware, MiddlewareContext
from mcp import MCPError
from mcp_types import INVALID_PARAMS

from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.hooks import RequestKind
from chainweaver.mcp.runs.recording import RUNS_URI

BODY_TOO_LARGE = "body_too_large"
CAPPED_KINDS = frozenset({"prompt", "resource"})


def body_size(kind: RequestKind, result: Any) -> int:
    """The bytes a prompt (its messages' text) or a read (its contents) returns."""
    if kind == "resource":
        return sum(_length(getattr(c, "content", "")) for c in result.contents)
    return sum(_length(getattr(m.content, "text", "")) for m in result.messages)


def _length(content: object) -> int:
    if isinstance(content, str):
        return len(content.encode("utf-8", "surrogatepass"))
    return len(content) if isinstance(content, (bytes, bytearray)) else 0


class BodyTooLarge(MCPError):
    """-32602: a prompt or read above the cap (the gate audits it as a refusal)."""


class BodyCap(Middleware):
    """Refuses an admitted prompt or read of this server whose body is above ``limit``."""

    def __init__(self, owner: str, limit: int | None) -> None:
        self.owner = owner
        self.limit = limit

    async def on_request(self, context: MiddlewareContext, call_next: Any) -> Any:
        result = await call_next(context)
        held = admission.current()
        record = held.of(self.owner) if held is not None else None
        if record is not None and record.owner == self.owner and record.kind is not None:
            too_large = oversize(record.kind, record.name, result, self.limit)
            if too_large is not None:
                raise too_large
        return result


def oversize(kind: RequestKind, name: str, result: Any, limit: int | None
             ) -> BodyTooLarge | None:
    """The -32602 error for a body above ``limit`` (None: within it, or no cap)."""
    if limit is None or kind not in CAPPED_KINDS:
        return None
    size = body_size(kind, result)
    if size <= limit:
        return None
    what = "prompt" if kind == "prompt" else "resource"
    hint = ""
    if kind == "resource" and name.startswith(RUNS_URI + "/") and "/output" in name:
        hint = f"; read it in ranges (?offset=N&length=M) of at most {limit} bytes"
    return BodyTooLarge(code=INVALID_PARAMS,
                        message=f"The {what} {name!r} is {size} bytes, above this server's "
                                f"limit of {limit} bytes per prompt or resource "
                                f"read{hint}",
                        data={"reason": BODY_TOO_LARGE, "limit": limit, "size": size})
