"""How the security gate serves a request it admitted, in one pass: as its admission,
a list's page checked and a rendered prompt or read capped (:mod:`.body_cap`); the
request counted and timed (the server's request metrics) and a flow run watched (the
server's spans and run counts) by plain calls before and after, never by wrappers that
call back into serving.

None of it is a middleware layer of its own: each FastMCP middleware layer costs every
request, and the gate knows the admission all of these read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fastmcp.server.middleware import MiddlewareContext

from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.admission import Admission
from chainweaver.mcp.gate.body_cap import oversize
from chainweaver.mcp.gate.requests import local_name
from chainweaver.mcp.publish.run_uris import RUNS_URI


class Finish(Protocol):
    """Told once how a request it started watching ended."""

    def done(self, result: Any) -> None: ...

    def failed(self, error: BaseException) -> None: ...


class RequestCounting(Protocol):
    """Counts and times admitted requests
    (:class:`~chainweaver.mcp.runs.metrics.RequestMetrics`)."""

    def start(self, record: Admission, method: str) -> Finish | None:
        """Start timing ``record``'s request (None: not counted)."""
        ...


class RunWatching(Protocol):
    """Watches admitted flow runs (:class:`~chainweaver.mcp.runs.telemetry.FlowTelemetry`)."""

    def begin(self, record: Admission) -> tuple[Admission, Finish] | None:
        """The record to serve the call as, its run's observers added, and what to tell
        when it ends (None: nothing watches this run)."""
        ...


@dataclass(frozen=True)
class AdmittedServing:
    """Serves what the gate of ``owner`` admitted.

    ``body_limit`` caps a rendered prompt or read (None: no cap); ``requests`` counts
    and times each request; ``runs`` watches each flow run.
    """

    owner: str = ""
    body_limit: int | None = None
    requests: RequestCounting | None = None
    runs: RunWatching | None = None

    async def serve(self, record: Admission, context: MiddlewareContext, call_next: Any,
                    *, count: bool = True) -> Any:
        """Serve the request as ``record`` says; refuse (-32602) a list whose cursor the
        provider found stale or forged, and a prompt or read above the body cap.
        ``count`` False: a parent's ``MountedGate`` serves it, and this server's own
        chain counts it under its own names (:meth:`count`)."""
        timer = self.requests.start(record, context.method or "") \
            if count and self.requests is not None and record.owner == self.owner else None
        watch = self.runs.begin(record) \
            if record.kind == "tool" and self.runs is not None else None
        served = record if watch is None else watch[0]
        try:
            with admission.admitted(served):
                result = await call_next(context)
            if record.page is not None:
                record.page.check()
            if record.owner == self.owner and record.kind is not None:
                too_large = oversize(record.kind, record.name, result, self.body_limit,
                                     record.runs_root)
                if too_large is not None:
                    raise too_large
        except BaseException as error:
            if watch is not None:
                watch[1].failed(error)
            if timer is not None:
                timer.failed(error)
            raise
        if watch is not None:
            watch[1].done(result)
        if timer is not None:
            timer.done(result)
        return result

    async def count(self, record: Admission | None, context: MiddlewareContext,
                    call_next: Any, runs_root: str = RUNS_URI) -> Any:
        """Serve a request admitted already, counted as this server's, under the name
        it has in this server's own chain (a parent's MountedGate admitted it under the
        parent's, namespaced one), where its run resources are at ``runs_root``."""
        if self.requests is None or record is None:
            return await call_next(context)
        own = record.named(local_name(record.kind, context.message, record.name), runs_root)
        timer = self.requests.start(own, context.method or "")
        if timer is None:
            return await call_next(context)
        try:
            result = await call_next(context)
        except BaseException as error:
            timer.failed(error)
            raise
        timer.done(result)
        return result
