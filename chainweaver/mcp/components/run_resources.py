"""Run records as resources: ``chainweaver://runs`` (the caller's runs, newest first,
paged, by flow and status), ``chainweaver://runs/{run_id}`` (one record) and
``chainweaver://runs/{run_id}/output`` (an output sent as a link, whole or in byte
ranges), with a template and completion for each.

A run answers only the caller that started it (the gate's caller id), and only while
its flow is in that caller's view; every other run id answers exactly like one that
never existed. The gate resolves a run URI to the run's flow (:meth:`RunResources.target`)
so its authorizer and audit see the flow; the provider serves it
(:meth:`RunResources.resource`), checking both again. A store that cannot be reached or
read answers -32603 with a fixed message (:data:`~.records.STORE_UNAVAILABLE`); the
store logs the detail.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from fastmcp.resources.base import Resource, ResourceContent, ResourceResult
from fastmcp.resources.template import ResourceTemplate
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, Annotations

from chainweaver.mcp.components.mistakes import invalid_request
from chainweaver.mcp.components.plain_slots import SET_BY_BUILD, PlainSlots
from chainweaver.mcp.components.resources import _json
from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.body_cap import MAX_RANGE_BYTES, MESSAGE_BUDGET, too_large_to_send
from chainweaver.mcp.gate.views import View
from chainweaver.mcp.publish.exposure import ExposedFlow
from chainweaver.mcp.publish.live_exposure import LiveExposure
from chainweaver.mcp.publish.run_uris import RUNS_URI
from chainweaver.mcp.runs.recording import OUTPUT_MIME, RunLog
from chainweaver.mcp.runs.records import (
    RUN_ID,
    STATUSES,
    RunQuery,
    RunRecord,
    RunStoreError,
    parse_cursor,
)
from chainweaver.mcp.runs.step_names import masked

LIST_TEMPLATE = RUNS_URI + "{?flow,status,cursor,limit}"
RUN_TEMPLATE = RUNS_URI + "/{run_id}"
OUTPUT_TEMPLATE = RUNS_URI + "/{run_id}/output{?offset,length}"
MIME_TYPE = "application/json"
DEFAULT_PAGE, MAX_PAGE = 50, 200
_ANNOTATIONS = Annotations(audience=["assistant", "user"], priority=0.5)
_QUERIES = {"list": {"flow", "status", "cursor", "limit"}, "record": set(),
            "output": {"offset", "length"}}


@dataclass(frozen=True)
class RunAddress:
    """What a run URI asks for: ``kind`` ``list``, ``record`` or ``output``."""

    kind: str
    run_id: str = ""
    query: tuple[tuple[str, str], ...] = ()

    def value(self, name: str) -> str | None:
        return next((value for key, value in self.query if key == name), None)


def parse(uri: str) -> RunAddress | None:
    """The address of a run URI (None: not one). A malformed query (an unknown or
    repeated parameter, a value out of range) raises -32602, before anything is
    looked up, so the answer says nothing about which runs exist."""
    parts = urlsplit(uri)
    path = (parts.netloc + parts.path).rstrip("/")
    if parts.scheme != "chainweaver" or parts.fragment:
        return None
    segments = path.split("/")
    if segments == ["runs"]:
        address = RunAddress("list")
    elif len(segments) == 2 and segments[0] == "runs":
        address = RunAddress("record", segments[1])
    elif len(segments) == 3 and segments[0] == "runs" and segments[2] == "output":
        address = RunAddress("output", segments[1])
    else:
        return None
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise _invalid(uri, "the query is not name=value pairs") from None
    names = [name for name, _ in query]
    unknown = sorted(set(names) - _QUERIES[address.kind])
    if unknown or len(set(names)) != len(names):
        allowed = ", ".join(sorted(_QUERIES[address.kind])) or "none"
        raise _invalid(uri, f"unknown or repeated parameter {(unknown or names)[0]!r} "
                            f"(allowed: {allowed})")
    address = RunAddress(address.kind, address.run_id, tuple(query))
    _check_values(uri, address)
    return address


def _check_values(uri: str, address: RunAddress) -> None:
    status = address.value("status")
    if status is not None and status not in STATUSES:
        raise _invalid(uri, f"status must be one of {', '.join(STATUSES)}")
    cursor = address.value("cursor")
    if cursor is not None:
        try:
            parse_cursor(cursor)
        except ValueError:
            raise _invalid(uri, "cursor is not one this server gave") from None
    for name, low, high in (("limit", 1, MAX_PAGE), ("offset", 0, 2**53),
                            ("length", 1, MAX_RANGE_BYTES)):
        text = address.value(name)
        # Digits first, and few of them: int() refuses text past 4,300 digits.
        if text is not None and not (text.isascii() and text.isdigit() and len(text) <= 20
                                     and low <= int(text) <= high):
            raise _invalid(uri, f"{name} must be a whole number from {low} to {high}")


def _invalid(uri: str, detail: str) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=f"Invalid run resource URI {uri!r}: "
                                                 f"{detail}")


def _unavailable(error: RunStoreError) -> MCPError:
    """What a client is told when the store failed: its fixed text, never the detail."""
    return MCPError(code=INTERNAL_ERROR, message=str(error))


class RunResource(PlainSlots, Resource):
    """A run resource, read when asked (records change while runs go on)."""

    __slots__ = ("_produce",)  # a plain attribute: a read calls it (plain_slots.py)
    if TYPE_CHECKING:
        _produce: Callable[[], Awaitable[ResourceResult]] = SET_BY_BUILD

    @classmethod
    def build(cls, produce: Callable[[], Awaitable[ResourceResult]], **fields: Any
              ) -> RunResource:
        resource = cls(annotations=_ANNOTATIONS, **fields)
        resource._produce = produce
        return resource

    async def read(self) -> ResourceResult:
        try:
            return await self._produce()
        except RunStoreError as error:
            raise _unavailable(error) from None


class RunResources:
    """Serves the run resources of one server's run log (see the module). Without a run
    history, ``log`` keeps only the outputs too large for one message, and only their
    ``/output`` URIs answer (``records`` False): the listing and the records stay
    exactly as for a server that has none."""

    def __init__(self, log: RunLog, live: LiveExposure, error_detail: str,
                 owner: str = "") -> None:
        self.log = log
        self.owner = owner  # the owner mark of the server's gate: whose caller reads
        self.live = live
        self.error_types = error_detail != "generic"
        self.records = log.records

    async def _owned(self, run_id: str) -> RunRecord | None:
        """The current caller's run ``run_id`` (None: none, or another caller's)."""
        if not RUN_ID.fullmatch(run_id):
            return None
        caller = admission.caller(self.owner).id
        try:
            record = await self.log.store.get(run_id, caller=caller)
        except RunStoreError as error:
            raise _unavailable(error) from None
        if record is None or record.caller != caller:
            return None
        return record

    async def target(self, uri: str) -> ExposedFlow | None:
        """For the gate: the flow of the caller's run a URI names (None: a listing, or
        no run of this caller's). The gate then checks the flow is in the view."""
        try:
            address = parse(uri)
        except MCPError:
            return None  # the read answers -32602, whoever asks
        if address is None or address.kind == "list":
            return None
        try:
            record = await self._owned(address.run_id)
        except MCPError:
            # The store failed: no flow is known, and the read itself answers the fixed
            # error (so the request is limited, authorized and audited like any other).
            return None
        return self.live.flow(record.flow) if record is not None else None

    async def resource(self, uri: str, view: View) -> Resource | None:
        """For the provider: the resource a run URI names for the current caller. A
        malformed one is found, and its read answers -32602 (FastMCP turns an error
        raised while finding a resource into "not found"), as FastMCP's client error:
        the caller's mistake, logged without a traceback (see :mod:`.mistakes`)."""
        try:
            address = parse(uri)
        except MCPError as error:
            return _refusing(uri, invalid_request(error.error.message))
        if address is None or (address.kind != "output" and not self.records):
            return None
        if address.kind == "list":
            return RunResource.build(lambda: self._listing(address, view), uri=uri,
                                     name="chainweaver_runs", title="Your runs",
                                     mime_type=MIME_TYPE,
                                     description="Runs you started, newest first.")
        try:
            record = await self._owned(address.run_id)
        except MCPError as error:  # the store failed: the read says so
            return _refusing(uri, error)
        if record is None or not view.allows(self.live.flow(record.flow)):
            return None  # exactly as for a run id that never existed
        # The run's flow, for the gate under a composition (see gate.composition.flow_of).
        if address.kind == "record":
            return RunResource.build(lambda: self._record(uri, record.run_id, view), uri=uri,
                                     name="chainweaver_run", mime_type=MIME_TYPE,
                                     title=f"Run {record.run_id}",
                                     meta={"chainweaver": {"run_flow": record.flow}})
        if not record.output_stored:
            return None
        return RunResource.build(lambda: self._output(uri, address, record), uri=uri,
                                 name="chainweaver_run_output", mime_type=OUTPUT_MIME,
                                 title=f"Output of run {record.run_id}",
                                 meta={"chainweaver": {"size": record.output_size,
                                                       "run_flow": record.flow}})

    async def _listing(self, address: RunAddress, view: View) -> ResourceResult:
        def keep(record: RunRecord) -> bool:
            return view.allows(self.live.flow(record.flow))

        flow = address.value("flow")
        if flow is not None and not view.allows(self.live.flow(flow)):
            # A flow outside the view lists no run: nothing to read, so the page costs
            # no walk through the caller's runs of a flow it cannot see (or never had).
            return ResourceResult([ResourceContent(
                _json({"runs": [], "next_cursor": None}), mime_type=MIME_TYPE)])
        limit = address.value("limit")
        records, cursor = await self.log.store.page(RunQuery(
            caller=admission.caller(self.owner).id, flow=flow,
            status=address.value("status"), cursor=address.value("cursor"),
            limit=int(limit) if limit else DEFAULT_PAGE, keep=keep))
        document = {"runs": [self._document(record, view) for record in records],
                    "next_cursor": cursor}
        return ResourceResult([ResourceContent(_json(document), mime_type=MIME_TYPE)])

    def _document(self, record: RunRecord, view: View) -> dict[str, Any]:
        """The record as this reader may read it now: a sub-flow it recorded by name that
        left the reader's view since (the parent did not) is one unnamed step."""
        return masked(record.document(error_types=self.error_types), record.subflows,
                      lambda name: view.allows(self.live.flow(name)))

    async def _record(self, uri: str, run_id: str, view: View) -> ResourceResult:
        # As it is now, not when resolved.
        record = await self.log.store.get(run_id, caller=admission.caller(self.owner).id)
        if record is None:
            # Dropped (retention) or no longer readable since it was found: exactly like
            # a run that never existed, never an empty record.
            raise invalid_request(f"Resource not found: {uri!r}")
        document = self._document(record, view)
        return ResourceResult([ResourceContent(_json(document), mime_type=MIME_TYPE)])

    async def _output(self, uri: str, address: RunAddress, record: RunRecord
                      ) -> ResourceResult:
        offset, length = address.value("offset"), address.value("length")
        ranged = offset is not None or length is not None
        if ranged and length is None:
            length = str(MAX_RANGE_BYTES)  # an open range reads what one message carries
        elif not ranged and (record.output_size or 0) > MESSAGE_BUDGET:
            # Sent whole it could not reach the client: refused before it is read.
            raise too_large_to_send("resource", uri, record.output_size or 0,
                                    ranged=True)
        data = await self.log.store.output(record.run_id, int(offset or 0),
                                           int(length) if length else None,
                                           caller=admission.caller(self.owner).id)
        if data is None:
            # Dropped (retention, or the spill's bounds) while its record is kept, or
            # since it was found: exactly like an output that never existed.
            raise invalid_request(f"Resource not found: {uri!r}")
        # A range may cut a character in two: ranges are bytes (a blob); all of it, text.
        content: str | bytes = data if ranged else data.decode("utf-8")
        return ResourceResult([ResourceContent(content, mime_type=OUTPUT_MIME, meta={
            "chainweaver": {"size": record.output_size, "sha256": record.output_sha256}})])

    def complete(self, uri: str, argument: str, typed: str, view: View) -> list[str] | None:
        """Completion values for the run templates (None: not one of them)."""
        if not self.records or uri not in (LIST_TEMPLATE, RUN_TEMPLATE, OUTPUT_TEMPLATE):
            return None
        if uri == LIST_TEMPLATE and argument == "status":
            return [status for status in STATUSES if status.startswith(typed)]
        if uri == LIST_TEMPLATE and argument == "flow":
            names = sorted({exposed.flow.name for exposed in
                            view.select(self.live.exposed_flows, _itself)})
            return [name for name in names if name.startswith(typed)]
        return []


def _itself(exposed: ExposedFlow) -> ExposedFlow:
    return exposed


def _refusing(uri: str, error: Exception) -> RunResource:
    """A resource whose read raises ``error`` (FastMCP turns an error raised while
    finding a resource into "not found")."""
    async def refuse() -> ResourceResult:
        raise error

    return RunResource.build(refuse, uri=uri, name="chainweaver_runs")


def run_templates() -> list[ResourceTemplate]:
    """The run templates, advertised for discovery and completion (reads are served
    by :meth:`RunResources.resource`)."""
    def template(uri: str, name: str, title: str, description: str,
                 names: tuple[str, ...], required: tuple[str, ...] = ()) -> ResourceTemplate:
        return ResourceTemplate(
            uri_template=uri, name=name, title=title, description=description,
            mime_type=MIME_TYPE, annotations=_ANNOTATIONS,
            parameters={"type": "object",
                        "properties": {n: {"type": "string"} for n in names},
                        "required": list(required)})

    return [
        template(LIST_TEMPLATE, "chainweaver_runs", "Your runs",
                 "Runs you started, newest first, 50 a page by default; filter by flow "
                 "and status, continue with next_cursor.",
                 ("flow", "status", "cursor", "limit")),
        template(RUN_TEMPLATE, "chainweaver_run", "One run",
                 "A run's record: status, times, steps, output size and SHA-256.",
                 ("run_id",), ("run_id",)),
        template(OUTPUT_TEMPLATE, "chainweaver_run_output", "A run's output",
                 "An output too large for a tool result, whole or in byte ranges.",
                 ("run_id", "offset", "length"), ("run_id",)),
    ]
