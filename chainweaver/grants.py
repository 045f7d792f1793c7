"""Step grants: what a caller must hold for a step to run on its behalf.

A tool, a flow step or a flow (run as a sub-flow) may declare :class:`Grants`: scopes
the caller must all hold, and claims whose value must be one of those listed. A flow
may :class:`Delegation` a step: run it with a grant its caller lacks, for a stated
reason. Before every attempt of a step (each tool call, retry, fallback and sub-flow
run) a run with a caller asks its :class:`~chainweaver.step_guard.StepGuard`, which
checks the declared grants against the caller as it is *now* and then asks the step
authorizer hook, if any, with a :class:`StepRequest` (the step's resolved arguments);
the hook answers with a :class:`StepDecision`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from .errors import DefinitionError

_REASON = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
StepKind = Literal["tool", "fallback", "subflow", "flow"]


def _claim_values(value: Any) -> frozenset[str]:
    """A claim's values: a space-separated string, or a list of strings."""
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, (list, tuple, set, frozenset)):
        return frozenset(item for item in value if isinstance(item, str))
    if isinstance(value, (bool, int, float)):
        return frozenset({str(value).lower() if isinstance(value, bool) else str(value)})
    return frozenset()


def _scope_set(value: Any) -> frozenset[str]:
    """A caller's scopes as a set: a list or set of names, or one space-separated
    string (as an OAuth ``scope`` claim); anything else holds none."""
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, (list, tuple, set, frozenset)):
        return frozenset(item for item in value if isinstance(item, str))
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
        held = getattr(caller, "scopes", None)
        if not isinstance(held, frozenset):  # a caller of the application's own making
            held = _scope_set(held)
        if not self.scopes <= held:  # one set operation on the common path
            return f"scope:{min(self.scopes - held)}"
        if self.claims:
            claims = getattr(caller, "claims", None)
            if not isinstance(claims, Mapping):
                claims = {}
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
    arguments (read-only; for a tool, as its input model validated them, defaults and
    normalised values included; for a sub-flow, the values passed to it);
    ``requires`` the declared grants; ``delegated`` the delegation's reason when the
    flow runs the step on its own grant.
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
