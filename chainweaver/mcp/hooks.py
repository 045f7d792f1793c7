"""What the security gate's hooks receive and return: the vocabulary for writing an
authenticator, a rate limiter, an authorizer or an audit sink.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# "task": a background task's creation and state changes (chainweaver.mcp.tasks).
RequestKind = Literal["tool", "resource", "prompt", "task"]
# JSON-RPC leaves -32000..-32099 to servers; one code for every gate refusal.
GATE_REFUSED = -32001
# A refusal carries only a reason code, never free text that could leak details.
REASON_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class CallerIdentity:
    """Who is calling, as established by the authenticator."""

    id: str
    claims: Mapping[str, Any] = field(default_factory=dict)


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
    created), ``"state"`` (a task changed state) or ``"completed"`` (an allowed
    request, or a task, finished). Content is never recorded: only
    the SHA-256 and UTF-8 byte length of the returned text."""

    timestamp: float
    phase: Literal["decision", "state", "completed"]
    kind: RequestKind
    name: str
    flow_name: str | None
    flow_version: str | None
    caller_id: str | None
    decision: Literal["allowed", "denied"]
    reason: str
    duration_ms: float | None = None
    outcome: Literal["ok", "error"] | None = None
    error_type: str | None = None
    result_sha256: str | None = None
    result_length: int | None = None
    task_id: str | None = None
    task_status: str | None = None


Authenticator = Callable[[GateContext], "CallerIdentity | None | Awaitable[CallerIdentity | None]"]
Authorizer = Callable[[GateContext], "bool | AuthorizationDecision | Awaitable[Any]"]
AuditHook = Callable[[AuditEvent], Any]


class RateLimiter(Protocol):
    """Admits a request (``True``) or refuses it with ``rate_limited`` (anything else)."""

    def acquire(self, caller: CallerIdentity, name: str) -> bool: ...
