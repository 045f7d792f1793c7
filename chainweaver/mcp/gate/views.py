"""Per-caller views: the exposure snapshot narrowed to the flows one caller may see.

``SecurityConfig(visible=...)`` takes a rule ``(caller, flow) -> bool``. A caller sees an
exposed flow only when the rule answers exactly ``True``; everywhere else (lists,
gets, completions, the index, the guide, tasks) the flow answers like a name that
never existed.

The rule is not called per request. Its answers are cached per *grant set*: the
caller's scopes plus the values of the claims the rule declares it reads
(:class:`Visibility`), per exposure snapshot. So that a cached answer can never be
one meant for somebody else, the rule receives only that grant set: a
:class:`CallerIdentity` whose ``id`` is ``"grant"``, with the caller's ``scopes`` and
just the declared ``claims`` (no subject, no client id, no other claim). Declare
``claims=("sub",)`` to make the view per subject.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

from chainweaver.errors import ExposureConfigError
from chainweaver.flows import Flow
from chainweaver.mcp.hooks import ANONYMOUS, CallerIdentity
from chainweaver.mcp.publish.decision import ExposedFlow
from chainweaver.mcp.publish.live_exposure import LiveExposure

logger = logging.getLogger("chainweaver.mcp.gate.views")

VisibleRule = Callable[[CallerIdentity, Flow], bool]
# Grant sets remembered per snapshot; the least recently used is dropped beyond this.
MAX_GRANT_SETS = 1024
T = TypeVar("T")

# Callers whose grant keys are remembered (the same caller object comes back for every
# request with the same token); the least recently seen is dropped beyond this.
MAX_KNOWN_CALLERS = 4096


@dataclass(frozen=True)
class Visibility:
    """A view rule and the claims it reads (the rest of the token is withheld from it).

    ``rule(caller, flow)`` must depend only on ``caller.scopes``, the claims named in
    ``claims`` and the flow: its answers are cached under exactly those.
    """

    rule: VisibleRule
    claims: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not callable(self.rule):
            raise ExposureConfigError(f"visible must be callable, got {self.rule!r}")
        claims = self.claims
        if isinstance(claims, str) or not all(isinstance(c, str) and c for c in claims):
            raise ExposureConfigError(f"Visibility claims must be a list of claim names, got "
                                      f"{claims!r}")
        object.__setattr__(self, "claims", tuple(claims))

    def grant(self, caller: CallerIdentity) -> tuple[Any, CallerIdentity]:
        """The cache key for ``caller``, and the identity the rule is shown."""
        claims = {name: caller.claims[name] for name in self.claims if name in caller.claims}
        key = (caller.scopes, tuple((name, _frozen(value)) for name, value in claims.items()))
        return key, CallerIdentity("grant", claims, scopes=caller.scopes)


def visible_claim(claim: str) -> Visibility:
    """A flow is visible when the token's ``claim`` lists the flow's governance owner.

    The claim may be a list of strings or one space-separated string. A flow with no
    owner is visible to nobody under this rule.
    """
    if not isinstance(claim, str) or not claim.strip():
        raise ExposureConfigError(f"visible_claim needs a claim name, got {claim!r}")

    def owner_listed(caller: CallerIdentity, flow: Flow) -> bool:
        owner = flow.governance.owner
        return owner is not None and owner in _claim_values(caller.claims.get(claim))

    owner_listed.__name__ = f"owner_in_{claim}"
    return Visibility(owner_listed, (claim,))


def _claim_values(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, (list, tuple, set, frozenset)):
        return frozenset(item for item in value if isinstance(item, str))
    return frozenset()


def _frozen(value: Any) -> Any:
    """A hashable stand-in for a claim value (claims are JSON)."""
    try:
        return json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(value)


class View:
    """One grant set's view of one exposure snapshot.

    ``holder``: the grant set step grants are checked against (scopes and the claims
    they read), when any tool or flow declares one: a flow is in the view only when it
    holds every grant the flow may ask for on any path, delegated steps aside
    (:mod:`chainweaver.grants`), so no caller is shown a flow that must fail for lack
    of a grant."""

    def __init__(self, rule: VisibleRule | None, grant: CallerIdentity,
                 holder: CallerIdentity | None = None) -> None:
        self._rule = rule
        self._grant = grant
        self._holder = holder
        self._answers: dict[tuple[str, str], bool] = {}
        self._cache: dict[str, Any] = {}

    @property
    def restricted(self) -> bool:
        """Whether a rule or step grants narrow this view (False: every exposed flow
        is visible)."""
        return self._rule is not None or self._holder is not None

    def allows(self, exposed: ExposedFlow | None) -> TypeGuard[ExposedFlow]:
        """Whether this view holds ``exposed`` (None, a name that resolves to no flow: no)."""
        if exposed is None:
            return False
        if self._rule is None and self._holder is None:
            return True
        flow = exposed.flow
        key = (flow.name, flow.version)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._holds(exposed) and (self._rule is None or self._ask(flow))
            self._answers[key] = answer
        return answer

    def _holds(self, exposed: ExposedFlow) -> bool:
        """Whether the grant set holds every grant a run of ``exposed`` may ask for."""
        if self._holder is None:
            return True
        plan = exposed.plan
        required = plan.required if plan is not None else None
        return required is None or required.held_by(self._holder)

    def select(self, flows: Iterable[T], flow_of: Callable[[T], ExposedFlow | None]
               ) -> list[T]:
        """The items of ``flows`` whose flow this view holds (``flow_of`` None: kept)."""
        if not self.restricted:
            return list(flows)
        return [item for item in flows
                if (exposed := flow_of(item)) is None or self.allows(exposed)]

    def cached(self, key: str, build: Callable[[], T]) -> T:
        """Something derived from this view alone (a list, the index), built once."""
        value = self._cache.get(key)
        if value is None:
            value = self._cache.setdefault(key, build())
        return value

    def _ask(self, flow: Flow) -> bool:
        assert self._rule is not None
        try:
            answer = self._rule(self._grant, flow)
        except Exception as error:  # a broken rule hides the flow; never breaks a request
            logger.warning("visible rule %s raised %s for flow %r: hidden",
                           getattr(self._rule, "__name__", "rule"), type(error).__name__,
                           flow.name)
            return False
        return answer is True  # only an explicit yes shows a flow


class Views:
    """The server's view rule, and the views it produced, per snapshot and grant set."""

    def __init__(self, visible: VisibleRule | Visibility | None) -> None:
        if visible is not None and not isinstance(visible, Visibility):
            visible = Visibility(visible)
        self.visibility = visible
        self._views: weakref.WeakKeyDictionary[Any, OrderedDict[Any, View]] = (
            weakref.WeakKeyDictionary())
        self._grants: OrderedDict[int, tuple[CallerIdentity, Any, CallerIdentity]] = (
            OrderedDict())
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether a view rule makes views differ per caller (see :meth:`per_caller`)."""
        return self.visibility is not None

    def per_caller(self, snapshot: Any) -> bool:
        """Whether callers of ``snapshot`` may see different views: a view rule, or a
        step grant declared anywhere (:attr:`Exposure.grant_claims`)."""
        if self.visibility is not None:
            return True
        if isinstance(snapshot, LiveExposure):
            snapshot = snapshot.current
        return getattr(snapshot, "grant_claims", None) is not None

    def of(self, snapshot: Any, caller: CallerIdentity) -> View:
        """The view of ``snapshot`` (an exposure snapshot) for ``caller``."""
        visibility = self.visibility
        if isinstance(snapshot, LiveExposure):
            snapshot = snapshot.current  # the request's pinned snapshot
        grant_claims = getattr(snapshot, "grant_claims", None)
        if visibility is None and grant_claims is None:
            # Without a rule or step grants every caller has the one view: found
            # without the lock.
            views = self._views.get(snapshot)
            view = views.get(None) if views is not None else None
            if view is not None:
                return view
        with self._lock:  # completions run in worker threads
            holder = None
            if visibility is None:
                key, grant = None, ANONYMOUS
            else:
                # The same caller object comes back for every request with the same
                # token: its grant key is worked out once (held with the caller, so its
                # id cannot be reused meanwhile).
                known = self._grants.get(id(caller))
                if known is not None and known[0] is caller:
                    key, grant = known[1], known[2]
                else:
                    key, grant = visibility.grant(caller)
                    self._grants[id(caller)] = (caller, key, grant)
                    if len(self._grants) > MAX_KNOWN_CALLERS:
                        self._grants.popitem(last=False)
            if grant_claims is not None:
                # Step grants: the view also depends on the scopes and on the claims the
                # declarations read (and only those are shown to the check).
                claims = {name: caller.claims[name] for name in sorted(grant_claims)
                          if name in caller.claims}
                key = (key, caller.scopes,
                       tuple((name, _frozen(value)) for name, value in claims.items()))
                holder = CallerIdentity("grant", claims, scopes=caller.scopes)
            views = self._views.get(snapshot)
            if views is None:
                views = self._views[snapshot] = OrderedDict()
            view = views.get(key)
            if view is None:
                view = views[key] = View(visibility.rule if visibility else None, grant,
                                         holder)
                if len(views) > MAX_GRANT_SETS:
                    views.popitem(last=False)
            else:
                views.move_to_end(key)
            return view


def check_visible(visible: object) -> VisibleRule | Visibility | None:
    """``SecurityConfig(visible=...)``: None, a callable or a :class:`Visibility`."""
    if visible is None or isinstance(visible, Visibility):
        return visible
    if not callable(visible):
        raise ExposureConfigError(f"visible must be None, a callable (caller, flow) -> bool "
                                  f"or a Visibility, got {visible!r}")
    return visible

