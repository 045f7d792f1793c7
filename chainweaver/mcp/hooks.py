"""What the security gate's hooks receive and return: the vocabulary for writing an
authenticator, a rate limiter, an authorizer or an audit sink.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

from chainweaver.step_guard import MAX_KEPT_DECISIONS, PATH_LIMIT

# "list" (tools/list, resources/list, resources/templates/list, prompts/list),
# "completion" (completion/complete) and "subscription" (subscriptions/listen,
# resources/subscribe, resources/unsubscribe, logging/setLevel) are authenticated,
# rate-limited and audited but never passed to the authorizer: the caller's view
# already narrows what they show or tell.
# "task": a background task's creation and state changes (chainweaver.mcp.tasks.extension).
RequestKind = Literal["tool", "resource", "prompt", "list", "completion", "subscription",
                      "task", "http"]
# JSON-RPC leaves -32000..-32099 to servers; one code for every gate refusal.
GATE_REFUSED = -32001
# A refusal carries only a reason code, never free text that could leak details.
REASON_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class CallerIdentity:
    """Who is calling: from the ``authenticator`` hook, or from the bearer token that
    the server's ``auth`` provider verified (see :func:`caller_from_token`).

    ``subject`` is the token's ``sub``, ``client_id`` the OAuth client, ``scopes`` the
    granted scopes and ``claims`` every claim of the token.
    """

    id: str
    claims: Mapping[str, Any] = field(default_factory=dict)
    subject: str | None = None
    client_id: str | None = None
    scopes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "scopes", frozenset(self.scopes))
        # A read-only copy: a caller's view is worked out once per caller object, so
        # claims changed behind its back must not keep showing the old view.
        object.__setattr__(self, "claims", MappingProxyType(dict(self.claims)))


ANONYMOUS = CallerIdentity("anonymous")


@dataclass(frozen=True)
class GateContext:
    """What the gate's hooks see about a request. Argument values are never included."""

    kind: RequestKind
    name: str
    flow_name: str | None
    flow_version: str | None
    headers: Mapping[str, str]
    caller: CallerIdentity | None = None


@dataclass(frozen=True)
class AuthorizationDecision:
    """An authorizer's answer; ``reason`` is the only thing a refused client sees."""

    allowed: bool
    reason: str = "forbidden"

    def __post_init__(self) -> None:
        if not isinstance(self.allowed, bool):
            raise TypeError(f"AuthorizationDecision.allowed must be True or False, got "
                            f"{self.allowed!r}")
        if not isinstance(self.reason, str) or not REASON_CODE.fullmatch(self.reason):
            raise TypeError("AuthorizationDecision.reason must be a short code of letters, "
                            "digits, '_', '.' and '-' (it is sent to the client), got "
                            f"{self.reason!r}")


@dataclass(frozen=True)
class AuditEvent:
    """One audit record. ``phase`` is ``"decision"`` (the gate's verdict; for a task:
    created), ``"completed"`` (an allowed request, or a task, finished: ``outcome``
    ``"ok"``, ``"error"`` or ``"cancelled"`` by the client), ``"state"`` (a task
    changed state; ``decision`` denied when a worker failed it without running it,
    ``reason`` saying why) or ``"approval"`` (the user's answer when a flow run asked for
    approval: ``decision`` allowed or denied, ``reason`` the answer, e.g. ``accept``,
    ``decline``, ``cancel``, ``no_answer``, ``unavailable``; ``step_id`` the step
    that needs it) or ``"step"`` (a step the run refused for the caller: ``decision``
    denied, ``step_id`` its path, ``reason`` the step authorizer's code). Content is
    never recorded: only the SHA-256 and UTF-8 byte length of the returned text.

    ``steps`` (on a flow run's ``"completed"`` record, when its flow declares step
    grants or the server has a step authorizer): every step decision of the run, the
    first few in full (``path``, ``kind``, ``target`` tool or flow, ``decision``,
    ``reason``, ``grant``: ``"caller"`` or ``"delegation"``), the rest counted
    (``allowed``, ``denied``, ``delegated``, ``omitted``).

    Every text field is bounded (see :func:`bounded_text`): a caller-supplied name,
    URI or task id longer than :data:`AUDIT_TEXT_LIMIT` characters is kept as a
    prefix, its length and the SHA-256 of the whole value, so one event serialises
    to at most :data:`MAX_AUDIT_EVENT_BYTES` bytes of JSON."""

    timestamp: float
    phase: Literal["decision", "completed", "approval", "state", "step"]
    kind: RequestKind
    name: str
    flow_name: str | None
    flow_version: str | None
    caller_id: str | None
    decision: Literal["allowed", "denied"]
    reason: str
    duration_ms: float | None = None
    outcome: Literal["ok", "error", "cancelled"] | None = None
    error_type: str | None = None
    result_sha256: str | None = None
    result_length: int | None = None
    step_id: str | None = None
    task_id: str | None = None
    task_status: str | None = None
    steps: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
                bounded = bounded_text(value)
                if bounded is not value:
                    object.__setattr__(self, name, bounded)


# The longest text an audit field keeps, in characters.
AUDIT_TEXT_LIMIT = 256
_TEXT_FIELDS = ("name", "flow_name", "flow_version", "caller_id", "reason", "error_type",
                "result_sha256", "step_id", "task_id", "task_status")
# One event as JSON (json.dumps, ensure_ascii=False, compact, UTF-8): every text field
# at the limit, each character at its longest (a control character is "\u00XX", 6
# bytes), plus the keys, the numbers and the punctuation (a generous 1 KiB).
MAX_AUDIT_EVENT_BYTES = len(_TEXT_FIELDS) * AUDIT_TEXT_LIMIT * 6 + 1024
# What ``steps`` adds to a run's "completed" record at most (chainweaver.grants: the
# kept decisions and the first refusal, two texts of PATH_LIMIT characters each, a
# reason code, and their keys); refusals never carry it.
MAX_STEPS_BYTES = (MAX_KEPT_DECISIONS + 1) * (2 * PATH_LIMIT * 6 + 256) + 256


def bounded_text(value: str, limit: int = AUDIT_TEXT_LIMIT) -> str:
    """``value`` as an audit record keeps it: unchanged when it is at most ``limit``
    characters of encodable text, else a prefix followed by
    ``…[<length> chars, sha256:<hex>]`` (the SHA-256 of the whole value's UTF-8 bytes,
    lone surrogates passed through), ``limit`` characters in all; a lone surrogate in
    the prefix becomes ``?``, so the record always encodes as UTF-8."""
    if len(value) <= limit and (value.isascii() or _encodable(value)):
        return value
    data = value.encode("utf-8", "surrogatepass")
    suffix = f"…[{len(value)} chars, sha256:{hashlib.sha256(data).hexdigest()}]"
    prefix = value[:max(0, limit - len(suffix))]
    prefix = prefix.encode("utf-8", "replace").decode("utf-8")
    return prefix + suffix


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def deliver_audit(hook: AuditHook, event: AuditEvent, timeout: float) -> None:
    """Send ``event`` to ``hook``, awaiting an async hook up to ``timeout`` seconds. A
    hook that fails or times out is logged, never raised: auditing must never break a
    request or a task."""
    try:
        value = hook(event)
        if inspect.isawaitable(value):
            await asyncio.wait_for(value, timeout)
    except Exception as error:
        logging.getLogger("chainweaver.mcp.gate.security").warning(
            "audit hook failed: %s", type(error).__name__)


def approval_decision(answer: str) -> Literal["allowed", "denied"]:
    """An approval record's ``decision``: only an ``accept`` allows the run."""
    return "allowed" if answer == "accept" else "denied"


Authenticator = Callable[[GateContext], "CallerIdentity | None | Awaitable[CallerIdentity | None]"]
Authorizer = Callable[[GateContext], "bool | AuthorizationDecision | Awaitable[Any]"]
AuditHook = Callable[[AuditEvent], Any]


class RateLimiter(Protocol):
    """Admits a request (``True``) or refuses it with ``rate_limited`` (anything else).

    ``acquire`` may be a coroutine function (a limiter shared through Redis is).
    """

    def acquire(self, caller: CallerIdentity, name: str) -> bool | Awaitable[bool]: ...
