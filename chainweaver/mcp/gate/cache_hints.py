"""Caching hints on 2026-07-28 answers: ``ttlMs`` and ``cacheScope`` (SEP-2549).

The 2026-07-28 revision has ``tools/list``, ``prompts/list``, ``resources/list``,
``resources/templates/list``, ``resources/read`` and ``server/discover`` say how long
a client may reuse the answer and whether a shared cache may hand it to somebody
else. Here:

- ``cacheScope`` is ``"public"`` only when every caller provably gets the same answer:
  no per-caller view rule, no bearer-token auth, no authenticator or authorizer hook.
  Otherwise a list or read says ``"private"`` (it depends on the caller's view), and
  so does every run-record read, always, under every composition: the gate that
  admits a read where its clients reach the run resources (``chainweaver://runs``, or
  ``chainweaver://shop/runs`` under ``Namespace("shop")`` or ``mount_into``) notes
  the answer as its caller's alone in the request's admission
  (:class:`~.admission.AnswerNote`); this middleware runs before every gate and
  cannot know where a composition put them. The templates list and ``server/discover``
  describe the server, not a view: always ``"public"``.
- ``ttlMs`` is ``FlowServer(discovery=Discovery(cache_ttl=...))`` (default 0: stale at
  once), never longer than the served state is sure to hold: under shared governance
  with ``stop_serving_after``, no later than the moment this process would stop
  serving for want of confirmation. It never depends on the snapshot a request was served
  from: a TTL cut short by a change would tell a caller that something outside its
  view changed.

A cached list never lets a client reach a flow governance withdrew: calls, reads and
renders are admitted against the snapshot current when they arrive. 2025-11-25
answers carry no hints and are left as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mcp_types.methods import CACHEABLE_METHODS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from chainweaver.mcp.gate.admission import AnswerNote, admitted, hinted_request
from chainweaver.mcp.publish.run_uris import is_run_uri

Scope = Literal["public", "private"]
# About the server, the same for every caller.
_SERVER_WIDE = frozenset({"resources/templates/list", "server/discover"})


@dataclass(frozen=True)
class CachePolicy:
    """How long answers may be reused (``ttl``, seconds) and whether they are the same
    for everyone (``shared``); ``hold`` says how long the served state is sure to hold
    (seconds; None: no bound of its own)."""

    ttl: float = 0.0
    shared: bool = False
    hold: Callable[[], float | None] | None = None

    def ttl_ms(self) -> int:
        """The TTL to send now (the same for every caller and every view)."""
        if self.ttl <= 0:
            return 0
        seconds = self.ttl
        held = self.hold() if self.hold is not None else None
        if held is not None:
            seconds = min(seconds, max(held, 0.0))
        return math.floor(seconds * 1000)

    def scope(self, method: str, params: Any = None) -> Scope:
        if method == "resources/read":
            uri = params.get("uri") if isinstance(params, Mapping) else None
            if isinstance(uri, str) and is_run_uri(uri):
                return "private"  # a run record is its caller's alone
        if method in _SERVER_WIDE or self.shared:
            return "public"
        return "private"

    def cache_control(self) -> str:
        """The HTTP ``Cache-Control`` of a document about the caller's view."""
        seconds = self.ttl_ms() // 1000
        scope = "public" if self.shared else "private"
        return f"{scope}, max-age={seconds}" if seconds > 0 else f"{scope}, no-cache"


class CacheHints:
    """MCP SDK server middleware setting ``ttlMs``/``cacheScope`` on 2026-07-28 answers
    of the cacheable methods (installed through ``fastmcp_seams.add_sdk_middleware``)."""

    def __init__(self, policy: CachePolicy) -> None:
        self.policy = policy

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        method = ctx.method
        if method not in CACHEABLE_METHODS or ctx.protocol_version not in \
                MODERN_PROTOCOL_VERSIONS:
            return await call_next(ctx)
        note = AnswerNote()
        with admitted(hinted_request(ctx.session, note)):
            result = await call_next(ctx)
        if not isinstance(result, dict) or result.get("resultType", "complete") != "complete":
            return result  # an interim answer carries no hints
        result["ttlMs"] = self.policy.ttl_ms()
        result["cacheScope"] = "private" if note.per_caller \
            else self.policy.scope(method, ctx.params)
        return result
