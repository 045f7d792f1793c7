"""Step grants: what a caller must hold for a step to run on its behalf.

A tool, a flow step or a flow (run as a sub-flow) may declare :class:`Grants`: scopes
the caller must all hold, and claims whose value must be one of those listed. A flow
may :class:`Delegation` a step: run it with a grant its caller lacks, for a stated
reason. Before every attempt of a step (each tool call, retry, fallback and sub-flow
run) a run with a caller asks its :class:`StepGuard`, which checks the declared grants
against the caller as it is *now* and then asks the step authorizer hook, if any, with
the step's resolved arguments. A run of a plan with no declared grants and no hook has
no guard at all: it pays nothing.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from .errors import DefinitionError

logger = logging.getLogger("chainweaver.grants")
_REASON = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
StepKind = Literal["tool", "fallback", "subflow", "flow"]
# Decisions one run keeps for its audit; past this they are counted only.
MAX_KEPT_DECISIONS = 16
PATH_LIMIT = 128  # characters of a step path (or target) an audit entry keeps


def _claim_values(value: Any) -> frozenset[str]:
    """A claim's values: a space-separated string, or a list of strings."""
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, (list, tuple, set, frozenset)):
        return frozenset(item for item in value if isinstance(item, str))
    if isinstance(value, (bool, int, float)):
        return frozenset({str(value).lower() if isinstance(value, bool) else str(value)})
    return frozenset()


def _claim_holds(value: Any, accepted: frozenset[str]) -> bool:
    """Whether a claim's value holds one of ``accepted`` (see :func:`_claim_values`)."""
    if isinstance(value, str) and " " not in value:
        return value in accepted
    if isinstance(value, (list, tuple)):
        return any(isinstance(item, str) and item in accepted for item in value)
    return not accepted.isdisjoint(_claim_values(value))


@dataclass(frozen=True)
class Grants:
    """What a caller must hold: every scope in ``scopes``, and for each claim in
    ``claims`` one of the values listed (a claim in the caller's token may be one
    value, a space-separated string or a list).

    ``Grants.of`` also takes a list of scopes, or ``{"scopes": [...], "claims": {...}}``.
    """

    scopes: frozenset[str] = frozenset()
    claims: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        scopes = self.scopes
        if isinstance(scopes, str) or not isinstance(scopes, Iterable) \
                or not all(isinstance(s, str) and s for s in scopes):
            raise DefinitionError(f"grants: scopes must be a list of scope names, got "
                                  f"{scopes!r}")
        object.__setattr__(self, "scopes", frozenset(scopes))
        if not isinstance(self.claims, Mapping):
            raise DefinitionError(f"grants: claims must map claim names to accepted "
                                  f"values, got {self.claims!r}")
        claims: dict[str, frozenset[str]] = {}
        for name, values in self.claims.items():
            if not isinstance(name, str) or not name:
                raise DefinitionError(f"grants: claim name {name!r} must be a non-empty "
                                      "string")
            items = [values] if isinstance(values, str) else values
            # A mapping iterates over its keys: {"type": None} would accept "type".
            if isinstance(items, (Mapping, bytes)) or not isinstance(items, Iterable) \
                    or not all(
                    isinstance(v, str) and v for v in items):
                raise DefinitionError(f"grants: claim {name!r} must list accepted values "
                                      f"(strings), got {values!r}")
            accepted = frozenset(items)
            if not accepted:
                raise DefinitionError(f"grants: claim {name!r} lists no accepted value")
            claims[name] = accepted
        object.__setattr__(self, "claims", MappingProxyType(dict(sorted(claims.items()))))

    @classmethod
    def of(cls, value: Any, where: str = "requires") -> Grants | None:
        """``value`` as grants: None, a Grants, a list of scopes, or a mapping with
        ``scopes`` and ``claims``; an empty declaration is None."""
        if value is None:
            return None
        if isinstance(value, Grants):
            grants = value
        elif isinstance(value, Mapping):
            unknown = set(value) - {"scopes", "claims"}
            if unknown:
                raise DefinitionError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}"
                                      " (allowed: scopes, claims)")
            try:
                grants = cls(frozenset(value.get("scopes") or ()), value.get("claims") or {})
            except TypeError as error:
                raise DefinitionError(f"{where}: {error}") from None
        elif isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
            grants = cls(frozenset(value))
        else:
            raise DefinitionError(f"{where} must be a list of scopes, a mapping with scopes "
                                  f"and claims, or a Grants, got {value!r}")
        return grants if grants.scopes or grants.claims else None

    def __hash__(self) -> int:
        return hash((self.scopes, tuple(self.claims.items())))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Grants):
            return NotImplemented
        return self.scopes == other.scopes and dict(self.claims) == dict(other.claims)

    def missing(self, caller: Any) -> str | None:
        """What ``caller`` (anything with ``scopes`` and ``claims``) lacks, as
        ``scope:<name>`` or ``claim:<name>`` (None: it holds every grant)."""
        if caller is None:
            return "caller"
        held: frozenset[str] = getattr(caller, "scopes", frozenset())
        if not self.scopes <= held:  # one set operation on the common path
            return f"scope:{min(self.scopes - held)}"
        if self.claims:
            claims = getattr(caller, "claims", None) or {}
            for name, accepted in self.claims.items():
                if not _claim_holds(claims.get(name), accepted):
                    return f"claim:{name}"
        return None

    def held_by(self, caller: Any) -> bool:
        return self.missing(caller) is None

    def union(self, other: Grants | None) -> Grants:
        """Both declarations at once (a claim in both: a value both accept)."""
        if other is None or other is self:
            return self
        claims = dict(self.claims)
        for name, accepted in other.claims.items():
            claims[name] = claims[name] & accepted if name in claims else accepted
        empty = [name for name, values in claims.items() if not values]
        if empty:
            # No value satisfies both: nobody holds it (a declaration nobody can meet).
            claims = {name: values or frozenset({"\x00never"}) for name, values
                      in claims.items()}
        return Grants(self.scopes | other.scopes, claims)

    def to_dict(self) -> dict[str, Any]:
        return {"scopes": sorted(self.scopes),
                "claims": {name: sorted(values) for name, values in self.claims.items()}}

    def describe(self) -> str:
        parts = [f"scope {s!r}" for s in sorted(self.scopes)]
        parts += [f"claim {n!r} in {sorted(v)}" for n, v in self.claims.items()]
        return ", ".join(parts)


def union(*declared: Grants | None) -> Grants | None:
    """Every declaration at once (None: none declared)."""
    result: Grants | None = None
    for grants in declared:
        if grants is not None:
            result = grants if result is None else result.union(grants)
    return result


@dataclass(frozen=True)
class Delegation:
    """A flow runs the step at ``step`` (a step id, or a path ``"outer/inner"`` into a
    sub-flow step) without asking its caller for the step's declared grants, because
    ``reason``. A delegated sub-flow step covers every step inside it. The step
    authorizer hook is still asked (it sees the delegation); exposure reports,
    ``inspect`` and the audit show it."""

    step: str
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.step, str) or not self.step or self.step.startswith("/") \
                or self.step.endswith("/") or "//" in self.step:
            raise DefinitionError(f"delegation: step must be a step id or a path "
                                  f"'outer/inner', got {self.step!r}")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise DefinitionError(f"delegation of step {self.step!r} needs a reason (why "
                                  "the flow runs it beyond its caller's grants)")

    def covers(self, path: str) -> bool:
        return path == self.step or path.startswith(self.step + "/")



    def to_dict(self) -> dict[str, str]:
        return {"step": self.step, "reason": self.reason}


def delegations_of(value: Any, where: str = "delegations") -> tuple[Delegation, ...]:
    """A flow's ``delegations=``: Delegation values or ``{"step", "reason"}`` mappings."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise DefinitionError(f"{where} must be a list of Delegation values, got {value!r}")
    result = []
    for item in value:
        if isinstance(item, Mapping):
            unknown = set(item) - {"step", "reason"}
            if unknown:
                raise DefinitionError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}"
                                      " (allowed: step, reason)")
            item = Delegation(item.get("step"), item.get("reason"))  # type: ignore[arg-type]
        if not isinstance(item, Delegation):
            raise DefinitionError(f"{where} must list Delegation values, got {item!r}")
        result.append(item)
    steps = [d.step for d in result]
    if len(set(steps)) != len(steps):
        raise DefinitionError(f"{where}: a step is delegated twice")
    return tuple(result)


@dataclass(frozen=True)
class StepRequest:
    """What the step authorizer hook is asked, before one attempt of one step.

    ``flow_name``/``flow_version``: the flow the caller called; ``path``: the step's
    path in it (``"outer/inner"`` for a sub-flow's step); ``kind``: ``"tool"`` (a call
    or a retry, ``attempt`` says which), ``"fallback"``, ``"subflow"`` (a sub-flow
    step, before its run) or ``"flow"`` (the called flow itself, before its first
    step). ``target``: the tool or flow name; ``tool`` the :class:`~chainweaver.Tool`
    (None for a sub-flow); ``safety`` its contract; ``arguments`` the step's resolved
    arguments (read-only); ``requires`` the declared grants; ``delegated`` the
    delegation's reason when the flow runs the step on its own grant.
    """

    caller: Any
    flow_name: str
    flow_version: str
    path: str
    kind: StepKind
    target: str
    tool: Any
    safety: Any
    arguments: Mapping[str, Any]
    requires: Grants | None
    delegated: str | None
    attempt: int = 1


@dataclass(frozen=True)
class StepDecision:
    """A step authorizer's answer; ``reason`` (a short code of letters, digits, ``_``,
    ``.`` and ``-``) is what the caller sees."""

    allowed: bool
    reason: str = "forbidden"

    def __post_init__(self) -> None:
        if not isinstance(self.allowed, bool):
            raise TypeError(f"StepDecision.allowed must be True or False, got "
                            f"{self.allowed!r}")
        if not isinstance(self.reason, str) or not _REASON.fullmatch(self.reason):
            raise TypeError("StepDecision.reason must be a short code of letters, digits, "
                            f"'_', '.' and '-' (the caller sees it), got {self.reason!r}")


StepAuthorizer = Callable[[StepRequest], "bool | StepDecision | Awaitable[Any]"]


class StepRefused(Exception):
    """Internal: a step the guard refused; the run stops there, before any effect."""

    def __init__(self, reason: str, path: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path


@dataclass
class Decisions:
    """Every step decision of one run, for its audit: the first
    :data:`MAX_KEPT_DECISIONS` as they were made, the rest counted."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    refusal: dict[str, Any] | None = None  # the first refused attempt
    allowed: int = 0
    denied: int = 0
    delegated: int = 0

    def add(self, path: str, kind: str, target: str, allowed: bool, reason: str,
            delegated: str | None) -> None:
        if allowed:
            self.allowed += 1
        else:
            self.denied += 1
        if delegated is not None:
            self.delegated += 1
        if len(self.kept) < MAX_KEPT_DECISIONS or (not allowed and self.refusal is None):
            entry = {"path": _cut(path), "kind": kind, "target": _cut(target),
                     "decision": "allowed" if allowed else "denied", "reason": reason,
                     "grant": "delegation" if delegated is not None else "caller"}
            if len(self.kept) < MAX_KEPT_DECISIONS:
                self.kept.append(entry)
            if not allowed and self.refusal is None:
                self.refusal = entry

    def summary(self) -> dict[str, Any]:
        total = self.allowed + self.denied
        return {"allowed": self.allowed, "denied": self.denied,
                "delegated": self.delegated, "omitted": max(0, total - len(self.kept)),
                "steps": [dict(entry) for entry in self.kept],
                "refused": None if self.refusal is None else dict(self.refusal)}


def _cut(text: str) -> str:
    return text if len(text) <= PATH_LIMIT else text[:PATH_LIMIT - 1] + "…"


# The caller as it is now (may return an awaitable; None: no caller any more).
CallerSource = Callable[[], Any]


class StepGuard:
    """Asks, before every attempt of every step of one run (and its sub-flows), whether
    the caller may run it now.

    ``caller``: a callable giving the caller as it is *now* (asked at every check, so
    a revoked grant stops the run at its next step). ``authorizer``: the server-wide
    step authorizer hook (None: declared grants only). ``delegations``: paths (in the
    top flow) the flows delegate. ``decisions`` collects what was decided.
    """

    __slots__ = ("caller", "authorizer", "flow_name", "flow_version", "prefix",
                 "delegations", "decisions", "approved")

    def __init__(self, caller: CallerSource, authorizer: StepAuthorizer | None,
                 flow_name: str, flow_version: str, *, prefix: str = "",
                 delegations: tuple[Delegation, ...] = (),
                 decisions: Decisions | None = None, approved: Any = None) -> None:
        self.caller = caller
        self.authorizer = authorizer
        self.flow_name = flow_name
        self.flow_version = flow_version
        self.prefix = prefix
        self.delegations = delegations
        self.decisions = decisions if decisions is not None else Decisions()
        # What the run's approval covers (chainweaver.engine.approved.ApprovedGrants), set
        # once it is approved; None: nothing to compare.
        self.approved = approved

    def keep_approval(self, approved: Any) -> None:
        """From now on, compare every covered check with what the run's approval
        covers (:class:`chainweaver.engine.approved.ApprovedGrants`)."""
        self.approved = approved

    def path(self, step_id: str) -> str:
        return f"{self.prefix}{step_id}"

    def inner(self, step_id: str, subflow_delegations: tuple[Delegation, ...]
              ) -> StepGuard:
        """The guard of a sub-flow step's run: its steps' paths start with the step's,
        and the sub-flow's own delegations hold inside it."""
        prefix = f"{self.prefix}{step_id}/"
        own = tuple(Delegation(prefix + d.step, d.reason) for d in subflow_delegations)
        return StepGuard(self.caller, self.authorizer, self.flow_name, self.flow_version,
                         prefix=prefix, delegations=self.delegations + own,
                         decisions=self.decisions, approved=self.approved)

    def delegated(self, path: str) -> str | None:
        for delegation in self.delegations:
            if delegation.covers(path):
                return delegation.reason
        return None

    def request(self, path: str, kind: StepKind, target: str, tool: Any, safety: Any,
                arguments: Mapping[str, Any], requires: Grants | None,
                attempt: int = 1) -> StepRequest:
        return StepRequest(None, self.flow_name, self.flow_version, path, kind, target,
                           tool, safety, MappingProxyType(dict(arguments)), requires,
                           self.delegated(path), attempt)

    def declared(self, request: StepRequest, caller: Any) -> str | None:
        """What ``caller`` (as it is now) lacks of the declared grants (None: nothing,
        or the step is delegated)."""
        if caller is None:
            return "no_caller"
        if request.requires is None or request.delegated is not None:
            return None
        return None if request.requires.held_by(caller) else "missing_grant"

    def decide(self, request: StepRequest) -> str | None:
        """Check ``request`` (from sync code: an async hook or caller source is awaited
        on a private loop); the refusal's reason, or None when the step may run."""
        try:
            caller = self.caller()
            if inspect.isawaitable(caller):
                caller = _blocking(caller)
        except Exception:
            caller = None
        refused = self.declared(request, caller)
        if refused is None and self.authorizer is not None:
            try:
                answer = self.authorizer(_asked(request, caller))
                if inspect.isawaitable(answer):
                    answer = _blocking(answer)
            except Exception as error:
                answer = _hook_failed(self.authorizer, error)
            refused = _verdict(answer)
        if refused is None and self.approved is not None:
            refused = self.approved.holds(request, caller)
        return self._noted(request, refused)

    async def decide_async(self, request: StepRequest) -> str | None:
        """:meth:`decide` on the event loop (an async hook is awaited)."""
        try:
            caller = self.caller()
            if inspect.isawaitable(caller):
                caller = await caller
        except Exception:
            caller = None
        refused = self.declared(request, caller)
        if refused is None and self.authorizer is not None:
            try:
                answer = self.authorizer(_asked(request, caller))
                if inspect.isawaitable(answer):
                    answer = await answer
            except Exception as error:
                answer = _hook_failed(self.authorizer, error)
            refused = _verdict(answer)
        if refused is None and self.approved is not None:
            refused = await self.approved.holds_async(request, caller)
        return self._noted(request, refused)

    def _noted(self, request: StepRequest, refused: str | None) -> str | None:
        self.decisions.add(request.path or "(flow)", request.kind, request.target,
                           refused is None, refused or "ok", request.delegated)
        return refused


def _hook_failed(hook: Any, error: Exception) -> StepDecision:
    """A hook that raised refuses the step (and the operator's log says why)."""
    logger.warning("step authorizer %s raised %s: step refused",
                   getattr(hook, "__name__", "hook"), type(error).__name__)
    return StepDecision(False, "step_authorizer_error")


def _blocking(awaitable: Awaitable[Any]) -> Any:
    # An async hook asked from the sync lane, which may itself run inside an event loop:
    # a fresh loop on a worker thread serves both (and keeps this module below calling).
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _awaited(awaitable)).result()


def _asked(request: StepRequest, caller: Any) -> StepRequest:
    return StepRequest(caller, request.flow_name, request.flow_version, request.path,
                       request.kind, request.target, request.tool, request.safety,
                       request.arguments, request.requires, request.delegated,
                       request.attempt)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _verdict(answer: Any) -> str | None:
    """None when the hook allowed the step; else the reason code. Only an explicit yes
    allows."""
    if isinstance(answer, StepDecision):
        if answer.allowed is True:
            return None
        reason = answer.reason
        return reason if isinstance(reason, str) and reason else "forbidden"
    return None if answer is True else "forbidden"


@dataclass(frozen=True)
class Caller:
    """A caller for in-process runs (``execute_flow(..., caller=Caller(...))``): an id,
    scopes and claims. An MCP server passes its gate's ``CallerIdentity`` instead."""

    id: str
    scopes: frozenset[str] = frozenset()
    claims: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scopes", frozenset(self.scopes))
        object.__setattr__(self, "claims", MappingProxyType(dict(self.claims)))


def fixed_caller(caller: Any) -> CallerSource:
    """A caller source for a caller that does not change during the run."""
    return lambda: caller
