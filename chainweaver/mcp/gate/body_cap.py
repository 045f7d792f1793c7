"""The byte cap on what one rendered prompt or resource read returns
(``ServingConfig.max_body_bytes``).

The gate (:mod:`.security`) measures the body an admitted prompt or read produced
before it leaves the server: text as UTF-8, blobs as their
bytes. Above the cap the request gets -32602 naming the cap (never the content), and
the gate audits it as refused (``body_too_large``).
Ranged reads of a run's output are measured per response, so an output above the cap
is read in ranges of at most the cap.
"""

from __future__ import annotations

from typing import Any

from mcp import MCPError
from mcp_types import INVALID_PARAMS

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
