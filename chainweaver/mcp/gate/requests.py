"""What the gate reads of a request and its result: the name a completion or a task
request refers to, the text a result returned and what the audit records of it (for
calls and background tasks alike), and the request as its hooks see it."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from chainweaver.mcp.gate.admission import RunNote
from chainweaver.mcp.hooks import CallerIdentity, GateContext, RequestKind
from chainweaver.mcp.publish.exposure import ExposedFlow


def payload_text(kind: RequestKind, result: Any) -> str:
    """The text a request returned, as the audit hashes it."""
    if kind == "tool":
        # A call run as a background task returns its handle, which has no content:
        # the task's own audit records its result (chainweaver.mcp.tasks.extension).
        return "\n".join(getattr(block, "text", "") for block in getattr(result, "content", ()))
    if kind == "resource":
        return "\n".join(
            c.content if isinstance(c.content, str) else c.content.hex() for c in result.contents
        )
    return "\n".join(getattr(m.content, "text", "") for m in result.messages)


# The error type audited for a result no transport can send (text that is not UTF-8).
UNSENDABLE = "UnsendableResult"


@dataclass(frozen=True, slots=True)
class Completed:
    """What the audit records of an admitted request that returned a result (an
    :class:`~chainweaver.mcp.hooks.AuditEvent` of phase ``"completed"``)."""

    outcome: Literal["ok", "error"]
    error_type: str | None = None
    result_sha256: str | None = None
    result_length: int | None = None
    # The run's step decisions (bounded; see chainweaver.grants), when its steps were
    # checked against the caller's grants.
    steps: dict[str, Any] | None = None


def completed(kind: RequestKind, result: Any, note: RunNote | None = None) -> Completed:
    """The audit of ``result``, for a call served inline and a background task's leg
    alike, so both record the same digest for the same result: the SHA-256 and UTF-8
    length of the text it returned; a flow call's ``isError`` result is an error, with
    the run's error type from ``note`` (which ``error_detail`` may keep from the
    client). An output sent as a resource link is audited by its own digest, as the
    link reads it back (the result holds a preview, and an isError flag when the flow
    has an output schema). A result that is not UTF-8 is an error, ``UnsendableResult``,
    with no digest: no transport can send it."""
    steps = note.steps if note is not None else None
    try:
        data = payload_text(kind, result).encode("utf-8")
    except UnicodeEncodeError:
        return Completed("error", UNSENDABLE, steps=steps)
    failed = kind == "tool" and bool(getattr(result, "is_error", False))
    digest, length = hashlib.sha256(data).hexdigest(), len(data)
    if note is not None and note.output_sha256 is not None \
            and note.output_length is not None:
        digest, length, failed = note.output_sha256, note.output_length, False
    return Completed("error" if failed else "ok",
                     note.error_type if note is not None and failed else None,
                     digest, length, steps)


def task_id_of(params: Any) -> str | None:
    """The ``taskId`` of a ``tasks/*`` request, when it names one (for the audit)."""
    task_id = params.get("taskId") if isinstance(params, Mapping) else None
    return task_id if isinstance(task_id, str) else None


def completion_target(params: Any) -> str:
    """The prompt name or template URI a ``completion/complete`` request refers to."""
    ref = params.get("ref") if isinstance(params, Mapping) else getattr(params, "ref", None)
    if isinstance(ref, Mapping):
        target = ref.get("name", ref.get("uri"))
    else:
        target = getattr(ref, "name", None) or getattr(ref, "uri", None)
    return target if isinstance(target, str) else ""


def gate_for(kind: RequestKind, name: str, exposed: ExposedFlow | None,
             headers: Mapping[str, str]) -> GateContext:
    """What the hooks see of a request for ``name`` reaching ``exposed`` (or no flow)."""
    return GateContext(kind, name, exposed.flow.name if exposed else None,
                       exposed.flow.version if exposed else None, headers)


def with_caller(gate: GateContext, caller: CallerIdentity) -> GateContext:
    """``gate`` as the authorizer sees it: with the caller."""
    return GateContext(gate.kind, gate.name, gate.flow_name, gate.flow_version, gate.headers,
                       caller)


def local_name(kind: RequestKind | None, message: Any, admitted: str) -> str:
    """The name a call, render or read has in this server's own chain (where FastMCP
    has taken a mount's namespace off it), else the name it was admitted under."""
    local = getattr(message, "name", None) if kind in ("tool", "prompt") \
        else getattr(message, "uri", None) if kind == "resource" else None
    return str(local) if isinstance(local, str) or kind == "resource" and local else admitted
