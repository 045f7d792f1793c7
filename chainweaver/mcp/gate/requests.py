"""What the gate reads of a request and its result: the name a completion or a task
request refers to, the text a result returned (as the audit hashes it), and the
request as its hooks see it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
