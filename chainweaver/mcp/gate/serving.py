"""How the security gate serves a request it admitted: as its admission, counted and
timed (the server's request metrics), a flow run watched (the server's spans and run
counts), a list's page checked and a rendered prompt or read capped (:mod:`.body_cap`).

None of it is a middleware layer of its own: each FastMCP middleware layer costs every
request, and the gate knows the admission all of these read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastmcp.server.middleware import MiddlewareContext

from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.admission import Admission
from chainweaver.mcp.gate.body_cap import oversize
from chainweaver.mcp.gate.requests import local_name
from chainweaver.mcp.publish.run_uris import RUNS_URI

# Serves an admitted request counted and timed: (record, context, serve).
Observe = Callable[[Admission, MiddlewareContext, Callable[[], Awaitable[Any]]],
                   Awaitable[Any]]
# Serves an admitted call with its run's own observers added to the record it is given.
WatchRun = Callable[[Admission, Callable[[Admission], Awaitable[Any]]], Awaitable[Any]]


@dataclass(frozen=True)
class AdmittedServing:
    """Serves what the gate of ``owner`` admitted.

    ``body_limit`` caps a rendered prompt or read (None: no cap); ``observe`` counts
    and times each request (:class:`~chainweaver.mcp.runs.metrics.RequestMetrics`);
    ``watch_run`` watches each flow run
    (:class:`~chainweaver.mcp.runs.telemetry.FlowTelemetry`).
    """

    owner: str = ""
    body_limit: int | None = None
    observe: Observe | None = None
    watch_run: WatchRun | None = None

    async def serve(self, record: Admission, context: MiddlewareContext, call_next: Any,
                    *, count: bool = True) -> Any:
        """Serve the request as ``record`` says; refuse (-32602) a list whose cursor the
        provider found stale or forged, and a prompt or read above the body cap.
        ``count`` False: a parent's ``MountedGate`` serves it, and this server's own
        chain counts it under its own names (:meth:`count`)."""
        if count and self.observe is not None and record.owner == self.owner:
            return await self.observe(record, context,
                                      lambda: self._served(record, context, call_next))
        return await self._served(record, context, call_next)

    async def count(self, record: Admission | None, context: MiddlewareContext,
                    call_next: Any, runs_root: str = RUNS_URI) -> Any:
        """Serve a request admitted already, counted as this server's, under the name
        it has in this server's own chain (a parent's MountedGate admitted it under the
        parent's, namespaced one), where its run resources are at ``runs_root``."""
        if self.observe is None or record is None:
            return await call_next(context)
        own = record.named(local_name(record.kind, context.message, record.name), runs_root)
        return await self.observe(own, context, lambda: call_next(context))

    async def _served(self, record: Admission, context: MiddlewareContext,
                      call_next: Any) -> Any:
        if record.kind == "tool" and self.watch_run is not None:
            return await self.watch_run(record, lambda watched: _call(watched, context,
                                                                      call_next))
        with admission.admitted(record):
            result = await call_next(context)
        if record.page is not None:
            record.page.check()
        if record.owner == self.owner and record.kind is not None:
            too_large = oversize(record.kind, record.name, result, self.body_limit,
                                 record.runs_root)
            if too_large is not None:
                raise too_large
        return result


async def _call(record: Admission, context: MiddlewareContext, call_next: Any) -> Any:
    with admission.admitted(record):
        return await call_next(context)
