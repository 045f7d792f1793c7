"""What one message may carry: the operator's byte cap on a rendered prompt or resource
read (``SecurityConfig.max_body_bytes``), and the wire limit every result stays under.

The gate (:mod:`.security`) measures the body an admitted prompt or read produced
before it leaves the server. Two bounds apply: the operator's cap, on the body itself
(text as UTF-8, blobs as their bytes), and :data:`WIRE_LIMIT`, on the body as it is
sent (text JSON-escaped as the most expansive transport sends it, blobs
base64-encoded): a standard MCP client cannot receive a larger message. Above either
the request gets -32602 naming the bound (never the content), and the gate audits it
as refused (``body_too_large``). A run's output is read in byte ranges of at most
:data:`MAX_RANGE_BYTES`, which always fit. Flow tool results are kept under it where
they are made (:mod:`chainweaver.mcp.runs.recording`), tool forms of reads and renders
in :mod:`chainweaver.mcp.components.tool_forms`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mcp import MCPError
from mcp_types import INVALID_PARAMS

from chainweaver.mcp.hooks import RequestKind
from chainweaver.mcp.publish.decision import GUIDE_PROMPT_NAME, INDEX_URI
from chainweaver.mcp.publish.run_uris import RUNS_URI

BODY_TOO_LARGE = "body_too_large"
CAPPED_KINDS = frozenset({"prompt", "resource"})
# The largest message a standard MCP client receives: the MCP SDK's client refuses a
# server-sent event above 1 MiB (its DEFAULT_MAX_SSE_EVENT_SIZE), on both protocol eras
# over streamable HTTP. The server keeps every result under it, on every transport.
WIRE_LIMIT = 2**20
# What one result's contents may take as sent; the rest is the JSON-RPC envelope's.
MESSAGE_BUDGET = WIRE_LIMIT - 32 * 1024
# The largest byte range of a run's output one read returns: sent as base64 (4/3 its
# size), it fits MESSAGE_BUDGET.
MAX_RANGE_BYTES = 512 * 1024


def sent_size(parts: Sequence[str | bytes]) -> int | None:
    """The bytes ``parts`` take inside one message (text as a JSON string, blobs as
    base64) when that is above :data:`MESSAGE_BUDGET`; None when within it.

    Text is measured as the 2026-07-28 streamable HTTP transport of the MCP SDK sends
    it, the most expansive one: every character outside ASCII escaped (``\\uXXXX``,
    twice that beyond the Basic Multilingual Plane), where stdio and the 2025-11-25
    transport send UTF-8. Cheap for what surely fits: an ASCII character takes at most
    6 bytes as sent and any other at most 12 (``str.isascii`` costs nothing), so only
    a result above a sixth (or a twelfth) of the budget is encoded to be measured.
    """
    bound = sum(_bound(part) for part in parts)
    if bound <= MESSAGE_BUDGET:
        return None
    size = sum(_sent(part) for part in parts)
    return size if size > MESSAGE_BUDGET else None


def _bound(part: str | bytes) -> int:
    if isinstance(part, str):
        return (6 if part.isascii() else 12) * len(part) + 2
    return 2 * len(part) + 2


def _sent(part: str | bytes) -> int:
    if isinstance(part, str):
        return len(json.dumps(part))  # ASCII only: its length is its size in bytes
    return 4 * ((len(part) + 2) // 3) + 2


def body_parts(kind: RequestKind, result: Any) -> list[str | bytes]:
    """What a prompt (its messages' text) or a read (its contents) returns."""
    if kind == "resource":
        return [getattr(c, "content", "") for c in result.contents]
    return [getattr(m.content, "text", "") for m in result.messages]


def _length(content: object) -> int:
    if isinstance(content, str):
        return len(content.encode("utf-8", "surrogatepass"))
    return len(content) if isinstance(content, (bytes, bytearray)) else 0


class BodyTooLarge(MCPError):
    """-32602: a prompt or read above the cap (the gate audits it as a refusal)."""


def oversize(kind: RequestKind, name: str, result: Any, limit: int | None,
             runs_root: str = RUNS_URI) -> BodyTooLarge | None:
    """The -32602 error for a body above ``limit`` (None: no operator cap) or too large
    to send in one message (None: within both); ``runs_root``: where the request's
    client reaches the run resources."""
    if kind not in CAPPED_KINDS:
        return None
    what = "prompt" if kind == "prompt" else "resource"
    ranged = kind == "resource" and is_output_uri(name, runs_root)
    parts = body_parts(kind, result)
    if limit is not None:
        size = sum(_length(part) for part in parts)
        if size > limit:
            hint = (f"; read it in ranges (?offset=N&length=M) of at most "
                    f"{min(limit, MAX_RANGE_BYTES)} bytes") if ranged else ""
            return BodyTooLarge(code=INVALID_PARAMS,
                                message=f"The {what} {name!r} is {size} bytes, above this "
                                        f"server's limit of {limit} bytes per prompt or "
                                        f"resource read{hint}",
                                data={"reason": BODY_TOO_LARGE, "limit": limit, "size": size})
    sent = sent_size(parts)
    if sent is None:
        return None
    return too_large_to_send(what, name, sent, ranged)


def is_output_uri(uri: str, runs_root: str = RUNS_URI) -> bool:
    """Whether ``uri`` names a run's output (which reads in ranges), where the request's
    client reaches the run resources (``runs_root``)."""
    return uri.startswith(runs_root + "/") and "/output" in uri


# Where a reader finds what a catalogue-wide body holds, in pages, when it is too large.
_PAGED = {("resource", INDEX_URI): "; resources/list lists the flows in pages",
          ("prompt", GUIDE_PROMPT_NAME): "; tools/list lists the flows in pages",
          ("tool result", "list_resources"): "; resources/list lists them in pages",
          ("tool result", "list_prompts"): "; prompts/list lists them in pages"}


def too_large_to_send(what: str, name: str, size: int, ranged: bool) -> BodyTooLarge:
    """-32602 for a body that would take ``size`` bytes as sent, above what one message
    carries (``ranged``: a run's output, which reads in ranges)."""
    hint = (f"; read it in ranges (?offset=N&length=M) of at most {MAX_RANGE_BYTES} bytes"
            if ranged else _PAGED.get((what, name), ""))
    return BodyTooLarge(code=INVALID_PARAMS,
                        message=f"The {what} {name!r} would take {size} bytes as sent, "
                                f"above the {MESSAGE_BUDGET} bytes one MCP message carries "
                                f"to a standard client{hint}",
                        data={"reason": BODY_TOO_LARGE, "limit": MESSAGE_BUDGET,
                              "size": size})
