"""One request, one admission: what the server decided about the request being served.

A request is admitted once, in one fixed order, by the security gate (the server's only
middleware layer). It first pins the exposure snapshot the whole request answers from
(:func:`pinned`), then authenticates the caller, resolves the request's target in *that
caller's* view of the snapshot, rate-limits, authorizes and audits (:mod:`.security`),
and serves it (:mod:`.serving`). What it decided is one
immutable :class:`Admission`, held in one context variable for the length of the
request. Every later part (the provider, the flow tool, runs, telemetry, tasks,
approval, notifications) reads it; none resolves a name or checks a view again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from fastmcp.server.dependencies import get_access_token
from mcp import MCPError
from mcp_types import INVALID_PARAMS

from chainweaver.mcp.gate.views import View, Views
from chainweaver.mcp.hooks import ANONYMOUS, CallerIdentity, GateContext, RequestKind
from chainweaver.mcp.publish.exposure import ExposedFlow, Exposure
from chainweaver.mcp.publish.live_exposure import LiveExposure
from chainweaver.mcp.publish.run_uris import RUNS_URI
from chainweaver.run_events import RunObserver


@dataclass
class ListPage:
    """The page a list request asks for, and what the provider says of the list it
    cut it from (the one part of an admission written after the gate: by the provider,
    which alone knows the caller's list)."""

    kind: str  # "tools", "resources", "prompts" or "templates"
    owner: str  # the owner mark of the server whose list handler serves it
    cursor: str | None = None  # the position the client sent (the fingerprint cut off)
    issued: str | None = None  # the fingerprint of the list that cursor was cut from
    size: int | None = None  # None: the whole list
    offset: int = 0
    fingerprint: str = ""  # of the caller's list (see chainweaver.mcp.live.cursors)
    more: bool = False  # items follow this page
    # Why the cursor is refused (-32602), found while the gate serves the list: the
    # gate raises it there, so the refusal is audited like any other.
    refused: str | None = None

    def check(self) -> None:
        """Raise the refusal the provider found for this page's cursor, if any."""
        if self.refused is not None:
            raise MCPError(code=INVALID_PARAMS, message=self.refused)


@dataclass
class RunNote:
    """What the flow tool tells the gate of the run an admitted ``tools/call`` started,
    for its audit: the error type of a failed run (which ``error_detail`` may keep
    from the client) and, for an output sent as a resource link, the output's digest
    and length (the result itself carries only a preview)."""

    run_id: str | None = None
    error_type: str | None = None
    output_sha256: str | None = None
    output_length: int | None = None
    # The run's step decisions (chainweaver.grants.Decisions.summary), when it had any.
    steps: dict[str, Any] | None = None


@dataclass
class AnswerNote:
    """What the gate learns of an answer the 2026-07-28 cache hints describe (the one
    part of an admission the hints read after the request was served):
    ``per_caller``, the answer is its caller's alone (a run read, wherever a
    composition put the run resources)."""

    per_caller: bool = False


@dataclass(frozen=True)
class Admission:
    """What the server decided about one request.

    ``pins``: the snapshot each live exposure answers from for this request (a mounted
    FlowServer pins its own beside its parent's). ``caller`` and ``view`` are set once
    the gate authenticated the request; ``kind``, ``name`` and ``target`` (the exposed
    flow the request reaches in that view, None when it reaches none) once it resolved
    it (``decided``). ``owner`` is the owner mark of the gate that admitted it;
    ``observers`` watch the steps of the run an admitted ``tools/call`` starts
    (telemetry's spans); ``run`` is where that run's tool notes what the audit needs.
    ``runs_root`` is where this request's client reaches the run resources: the
    server's own ``chainweaver://runs``, or where a composition (a ``Namespace``,
    ``mount_into``) puts them; a run URI the request reads, and any link it writes,
    is there.
    """

    request: object
    outer: Admission | None = None  # another server's decision this one is nested in
    pins: tuple[tuple[LiveExposure, Exposure], ...] = ()
    # The session record's: told each caller the gate admits, and the request context
    # its authenticator was asked with.
    learn: Callable[[CallerIdentity, GateContext], None] | None = None
    caller: CallerIdentity | None = None
    # What the authenticator admitted ``caller`` from, for a list-like request (a
    # listen stream asks it again when there is news; None: no authenticator asked).
    asked: GateContext | None = None
    view: View | None = None
    owner: str | None = None
    kind: RequestKind | None = None
    name: str = ""
    target: ExposedFlow | None = None
    decided: bool = False
    audit_approval: Callable[[str, str], Awaitable[None]] | None = None
    observers: tuple[RunObserver, ...] = ()  # told about the admitted run's steps
    page: ListPage | None = field(default=None, compare=False)
    run: RunNote | None = field(default=None, compare=False)  # an admitted call's run
    runs_root: str = RUNS_URI
    answer: AnswerNote | None = field(default=None, compare=False)  # a hinted answer's

    def _but(self, **changes: Any) -> Admission:
        """This record with ``changes``: a new record (this one never changes).

        What ``dataclasses.replace`` does, without its per-call field introspection:
        a request makes several records, and that cost showed on every call. Other
        modules make records through the named factories below."""
        record = object.__new__(Admission)
        record.__dict__.update(self.__dict__)
        record.__dict__.update(changes)
        return record

    def listing(self, kind: RequestKind, name: str) -> Admission:
        """This admitted request's record for a list, completion, subscription or task
        request served inside it (one a tool the gate admitted makes, or one a
        parent's ``MountedGate`` admitted for it): decided, reaching no flow."""
        return self._but(kind=kind, name=name, target=None, decided=True)

    def reaching_none(self) -> Admission:
        """This undecided record, decided: the request reaches no flow of its gate's
        server (a name a mounted server does not publish to this caller)."""
        return self._but(decided=True)

    def named(self, name: str, runs_root: str) -> Admission:
        """This record as a server's own chain names the request (a parent's
        ``MountedGate`` admitted it under the parent's names), with its run resources
        at ``runs_root``."""
        return self._but(name=name, runs_root=runs_root)

    def watched_by(self, observers: tuple[RunObserver, ...]) -> Admission:
        """This record with ``observers`` also told of the admitted run's steps."""
        return self._but(observers=(*self.observers, *observers))

    def snapshot_of(self, live: LiveExposure) -> Exposure | None:
        """The snapshot ``live`` answers from for this request (None: not pinned)."""
        for pinned_live, snapshot in self.pins:
            if pinned_live is live:
                return snapshot
        return None

    def of(self, owner: str) -> Admission | None:
        """The record ``owner``'s gate made of this request (a FlowServer mounted in
        another admits the request again, nested in the other's record); a record no
        gate made (a pinned request, a background task's run) stands for any server."""
        record: Admission | None = self
        while record is not None:
            if record.owner == owner or record.owner is None:
                return record
            record = record.outer
        return None

    def admits(self, owner: str, kind: RequestKind) -> tuple[bool, ExposedFlow | None]:
        """Whether ``owner``'s gate decided this ``kind`` of request, and the flow it
        admitted it for (None: none in the caller's view)."""
        record = self.of(owner)
        if record is None or record.owner != owner or not record.decided \
                or record.kind != kind:
            return False, None
        return True, record.target

    def looks_up(self, owner: str) -> bool:
        """Whether this is a call, read or render of ``owner``'s: a list made to serve
        it (FastMCP lists to resolve some names) need only hold its target."""
        record = self.of(owner)
        return record is not None and record.owner == owner \
            and record.kind in ("tool", "resource", "prompt")

    def nested_in(self, owner: str) -> Admission | None:
        """This request's record by ``owner``'s gate, when the request already passed
        that gate (a read a tool the gate admitted makes, or a request a parent's
        ``MountedGate`` admitted for it)."""
        record = self.of(owner)
        return record if record is not None and record.owner == owner \
            and record.caller is not None else None


_ADMISSION: ContextVar[Admission | None] = ContextVar("chainweaver_admission", default=None)
# Every request's first record is a copy of this one (cheaper than the constructor).
_BLANK = Admission(None)


def current() -> Admission | None:
    """The admission of the request being served (None: outside any request)."""
    return _ADMISSION.get()


class admitted:  # noqa: N801 - used like a function: ``with admitted(record):``
    """Serve what runs inside as ``record``.

    A class rather than a generator context manager: every request enters several,
    and this costs a fraction of one."""

    __slots__ = ("record", "token")

    def __init__(self, record: Admission) -> None:
        self.record = record

    def __enter__(self) -> Admission:
        self.token = _ADMISSION.set(self.record)
        return self.record

    def __exit__(self, *exc_info: object) -> None:
        _ADMISSION.reset(self.token)


def pinned(request: object, live: LiveExposure,
           learn: Callable[[CallerIdentity, GateContext], None] | None = None
           ) -> Admission | None:
    """The admission to serve ``request`` (any object naming one request) as, with
    ``live``'s snapshot current now pinned; None: the request pinned it already.

    Pinning again for the same request keeps its snapshot. A task started inside a
    request inherits its admission, so an admission made for another request never
    counts: it starts afresh.
    """
    held = _ADMISSION.get()
    if held is None or held.request is not request:
        return _BLANK._but(request=request, pins=((live, live.latest),), learn=learn)
    if held.snapshot_of(live) is None:
        # Another server's first pin in this request: the session record told what
        # its gate admits is this server's (None: it follows the token), never the
        # other's (that gate admitted the request before passing it on).
        return held._but(pins=(*held.pins, (live, live.latest)), learn=learn)
    return None if learn is None else held._but(learn=learn)


def gate_record(held: Admission | None, caller: CallerIdentity, view: View, owner: str,
                kind: RequestKind, name: str, target: ExposedFlow | None, *,
                decided: bool = True,
                audit_approval: Callable[[str, str], Awaitable[None]] | None = None,
                run: RunNote | None = None, runs_root: str = RUNS_URI,
                asked: GateContext | None = None) -> Admission:
    """The admission ``owner``'s gate made of a request of ``caller`` seeing ``view``,
    inside ``held`` (the request's record so far, None: none yet); ``decided`` False:
    while the gate resolves the request's name. ``audit_approval``: how a call's
    approval answers are audited; ``run``: where the run a call starts notes what its
    audit needs; ``runs_root``: where the request's client reaches the run resources;
    ``asked``: what the authenticator admitted ``caller`` from.
    """
    base = held or Admission(object())
    # Another server's gate decided this request first (this server is mounted in
    # it): keep its record, for its own components, and make this gate's inside it.
    foreign = held is not None and held.owner not in (None, owner)
    outer = held if foreign else base.outer
    observers = () if foreign else base.observers
    return base._but(caller=caller, view=view, owner=owner, kind=kind, name=name,
                     target=target, decided=decided, audit_approval=audit_approval,
                     outer=outer, observers=observers, run=run, runs_root=runs_root,
                     asked=asked)


def beside(held: Admission | None, decided: Admission) -> Admission:
    """What a request another gate found is not its server's is served as: ``held``
    (the record so far) when a gate made it, with ``decided`` (the other gate's
    record) kept beside it, where that server's components find it (:meth:`of`) but
    nothing reads it as the request's own (its caller, its run, its runs root);
    ``decided`` itself when no gate made ``held``."""
    if held is None or held.owner is None:
        return decided
    return held._but(outer=decided._but(outer=held.outer))


def list_request(session: object, page: ListPage) -> Admission:
    """The admission a list request starts with: the page it asks for (the gate's first
    step pins its snapshot in the same record: same request, its ``session``)."""
    return Admission(session, page=page)


def hinted_request(session: object, note: AnswerNote) -> Admission:
    """The admission a request whose answer gets cache hints starts with: ``note``,
    where the gate says what it learns of the answer (same request: its
    ``session``)."""
    return Admission(session, answer=note)


def answer_per_caller() -> None:
    """The answer being served is its caller's alone (see :class:`AnswerNote`)."""
    held = _ADMISSION.get()
    if held is not None and held.answer is not None:
        held.answer.per_caller = True


def task_request(session: object, owner: str, method: str,
                 target: ExposedFlow | None) -> Admission:
    """The admission of a ``tasks/*`` request (``method``) served by ``owner``'s tasks
    extension, with the flow its task runs (only the task's id names it): the gate's,
    or, for a request no gate admitted, a new one of ``session``."""
    held = _ADMISSION.get() or Admission(session)
    return held._but(owner=owner, kind="task", name=method, target=target, decided=True)


def task_leg(execution: object, caller: CallerIdentity, runs_root: str) -> Admission:
    """The admission a background task's leg runs under: as the ``caller`` that created
    the task, its client reading runs at ``runs_root``."""
    return Admission(execution, caller=caller, runs_root=runs_root)


def pinned_snapshot(live: LiveExposure) -> Exposure | None:
    """The snapshot the request being served pinned for ``live``, if any."""
    held = _ADMISSION.get()
    return held.snapshot_of(live) if held is not None else None


def caller(owner: str | None = None) -> CallerIdentity:
    """The caller of the request being served: the gate's, else the token's.

    ``owner``: as the gate with that owner mark admitted it. A component of a mounted
    server asks so: another FlowServer mounted in the same parent (or the parent's
    own FlowServer) admits the request too, and its caller is never this one's. A
    request that gate has not admitted (yet: another gate looks a name up in its
    caller's view) is its current record's."""
    held = _ADMISSION.get()
    record = held.of(owner) if held is not None and owner is not None else None
    record = record or held
    if record is not None and record.caller is not None:
        return record.caller
    return caller_from_token()


def learn_caller(identity: CallerIdentity, gate: GateContext) -> None:
    """Tell the session the request came on which caller the gate admitted (``gate``:
    what its authenticator was asked), so it is told only what changes in that
    caller's view."""
    held = _ADMISSION.get()
    if held is not None and held.learn is not None:
        held.learn(identity, gate)


# Verified bearer token -> its caller, built once per token (the transport verifies
# the token on every request; the cached caller is checked against what it verified).
_TOKEN_CALLERS: OrderedDict[str, CallerIdentity] = OrderedDict()
MAX_TOKEN_CALLERS = 4096
_TOKEN_LOCK = threading.Lock()


def caller_from_token() -> CallerIdentity:
    """The caller of the current request, from the token FastMCP's ``auth`` verified.

    ``id`` is ``client_id|subject``, or the client id alone when the token has no
    subject (:func:`token_caller_id`). No token: :data:`ANONYMOUS`.
    """
    try:
        token = get_access_token()
    except RuntimeError:  # pragma: no cover - no request context at all
        token = None
    if token is None:
        return ANONYMOUS
    return token_caller(token)


def token_expiry() -> float | None:
    """When the verified bearer token of the current request expires (seconds since the
    epoch; None: no token, or it says no expiry)."""
    return token_caller_and_expiry()[1]


def token_caller_and_expiry() -> tuple[CallerIdentity, float | None]:
    """:func:`caller_from_token` and :func:`token_expiry` with one look at the token."""
    try:
        token = get_access_token()
    except RuntimeError:  # pragma: no cover - no request context at all
        token = None
    if token is None:
        return ANONYMOUS, None
    expires = token.expires_at
    return token_caller(token), float(expires) if isinstance(expires, int | float) else None


def token_caller(token: Any) -> CallerIdentity:
    """The caller a token the server's ``auth`` verified names (built once per token)."""
    with _TOKEN_LOCK:  # completions run in worker threads
        known = _TOKEN_CALLERS.get(token.token)
        # Two servers' verifiers may read one token string differently (static tokens).
        if known is None or known.client_id != token.client_id or \
                known.claims != (token.claims or {}) or known.scopes != set(token.scopes):
            known = _TOKEN_CALLERS[token.token] = _caller_of(token)
            if len(_TOKEN_CALLERS) > MAX_TOKEN_CALLERS:
                _TOKEN_CALLERS.popitem(last=False)
    return known


def _caller_of(token: Any) -> CallerIdentity:
    claims = dict(token.claims or {})
    subject = token.subject or (claims.get("sub") if isinstance(claims.get("sub"), str)
                                else None)
    return CallerIdentity(token_caller_id(token.client_id, subject), claims,
                          subject=subject, client_id=token.client_id,
                          scopes=frozenset(token.scopes))


def token_caller_id(client_id: str, subject: str | None) -> str:
    """The caller id of a token: ``client_id|subject``, or the client id alone.

    A ``%`` or ``|`` in the client id is percent-encoded (``%25``, ``%7C``), so the
    first ``|`` always ends the client id and no two tokens share an id: client
    ``a|b`` with subject ``c`` is ``a%7Cb|c``, client ``a`` with subject ``b|c`` is
    ``a|b|c`` (they met in one id before, and so shared runs, tasks and budgets).
    Subjects are kept as they are (``auth0|1234``)."""
    client = client_id.replace("%", "%25").replace("|", "%7C")
    return f"{client}|{subject}" if subject else client



def input_schema_lookup(fastmcp: Any, exposure: Any, views: Views, *,
                        caller_known: bool) -> Callable[[str], Any]:
    """What the MCP SDK reads to check ``Mcp-Param-*`` headers of a 2026-07-28
    ``tools/call`` over HTTP: a published tool's input schema, in the view of the
    token's caller.

    Without it the SDK runs a whole ``tools/list`` through the middleware before every
    such call (a gated, audited, rate-limited list per call). It runs before any
    middleware, so it answers ``None`` (no header check, as the SDK does when its list
    fails) whenever it cannot tell what this caller sees: a flow outside the token
    caller's view, an ``authenticator`` hook deciding the caller later, or a transform
    on the server that renames tools.
    """
    def lookup(name: str) -> Any:
        per_caller = views.per_caller(exposure)
        if fastmcp.transforms or (per_caller and not caller_known):
            return None
        exposed = exposure.tool(name)
        if exposed is None or (per_caller and not views.of(
                exposure, caller_from_token()).allows(exposed)):
            return None
        return exposed.contract.input_schema

    return lookup
