"""The governance filter's result: what a server publishes, read by every primitive.

An :class:`Exposure` answers "is this published, and as what?" for a tool name, a
resource URI, a prompt name or a flow name by judging just the flow concerned
(:func:`~.decision.decide_flow`, memoised), so a server starts and looks names up
without visiting the catalogue. Lists, ``exposure_report()``, the index and the guide
read the :class:`Catalogue`: every flow decided, once, on first need. A tools list that
every caller sees whole reads :meth:`Exposure.published_tools` instead: every flow
judged, but what each publishes built only when its page reads it. All come from the
same memoised decisions (and the same checks), so they always agree. A server reads
its current snapshot through :class:`~.live_exposure.LiveExposure`.
"""

from __future__ import annotations

import bisect
import functools
import gc
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from chainweaver.errors import ExposureConfigError
from chainweaver.executor import FlowExecutor
from chainweaver.flows import Flow
from chainweaver.mcp.config import ExposurePolicy
from chainweaver.mcp.publish.decision import (
    GUIDE_PROMPT_NAME,
    INDEX_URI,
    ExposedFlow,
    FlowDecision,
    FlowExposure,
    PromptEntry,
    decide_flow,
    judge_flow,
    schema_uri,
)
from chainweaver.prompts import FlowPrompt
from chainweaver.registry import RegistryState

__all__ = ["GUIDE_PROMPT_NAME", "INDEX_URI", "Catalogue", "ExposedFlow", "Exposure",
           "FlowExposure", "PromptEntry", "schema_uri"]

_SCHEMA_PREFIX, _SCHEMA_SUFFIX = schema_uri("\0").split("\0")


@dataclass
class Catalogue:
    """Every flow decided: what lists, the report, the index and the guide read."""

    report: list[FlowExposure] = field(default_factory=list)
    tools: dict[str, ExposedFlow] = field(default_factory=dict)
    resources: dict[str, ExposedFlow] = field(default_factory=dict)
    prompts: dict[str, PromptEntry] = field(default_factory=dict)


P = ParamSpec("P")
R = TypeVar("R")


def _cyclic_gc_paused(build: Callable[P, R]) -> Callable[P, R]:
    """Run ``build`` with the cyclic garbage collector paused (restored afterwards).

    The decision allocates a few objects per flow and they all survive (they are the
    snapshot), so the collector's passes over the growing heap can free nothing: at
    20,000 flows they were a third of the decision's time. Reference counting still
    frees everything else at once.
    """
    @functools.wraps(build)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():
            return build(*args, **kwargs)
        gc.disable()
        try:
            return build(*args, **kwargs)
        finally:
            gc.enable()
    return paused


class Exposure:
    """What a server publishes under one policy, decided per flow when first needed.

    An immutable snapshot of one registry state (:attr:`sequence`): later changes to
    the registry never change what it answers. Construction checks what can be
    checked without judging every flow, and judges every flow at once only when
    names could collide (a flow name holding ``__``, a tool name too long, the
    guide's name): then a collision raises :class:`ExposureConfigError` here, never
    on a request. Built from a ``previous`` snapshot, it carries over the decisions
    about flows that did not change (see :meth:`_carried`).
    """

    def __init__(
        self,
        executor: FlowExecutor,
        policy: ExposurePolicy,
        *,
        expose_schemas: bool = False,
        expose_prompts: bool = False,
        server_prompts: Sequence[FlowPrompt] = (),
        state: RegistryState | None = None,
        previous: Exposure | None = None,
    ) -> None:
        self.policy = policy
        self.expose_schemas = expose_schemas
        self.expose_prompts = expose_prompts
        self._executor = executor
        self._server_prompts = {p.name: p for p in server_prompts}
        if len(self._server_prompts) != len(server_prompts):
            raise ExposureConfigError("server-level prompts must have unique names")
        if not policy.prompts.publishes("server"):
            self._server_prompts = {}  # withheld by the prompt policy: never published
        self._server_prompt_names = frozenset(self._server_prompts)
        self._guide = policy.prompts.publishes("guide")
        # The registry as it stands now is what this exposure decides about, even for
        # flows it judges later: a change made afterwards is not part of it.
        self._state = state if state is not None else executor.registry.state()
        if policy.flow_names is not None and previous is None:
            # Checked when a server is built; a flow named there may go away later.
            unknown = sorted(n for n in policy.flow_names if n not in self._state)
            if unknown:
                raise ExposureConfigError(
                    f"flow_names names unregistered flow(s): {', '.join(unknown)}")
        prompt_flows = policy.prompts.flow_names
        if prompt_flows is not None and previous is None:
            unknown = sorted(n for n in prompt_flows if n not in self._state)
            if unknown:
                raise ExposureConfigError(
                    f"prompts.flow_names names unregistered flow(s): {', '.join(unknown)}")
        # The previous snapshot's decisions, to carry over (its dict, not itself: a
        # snapshot never keeps the one before it alive). Dropped once every flow is
        # decided. Only entries about the very same flow object are used.
        self._carry = previous._decisions if previous is not None else {}
        # The previous snapshot's catalogue (when it had one), to patch instead of
        # redoing: (its registry state, its catalogue, its flows with sub-flow steps).
        self._base: tuple[RegistryState, Catalogue, frozenset[str]] | None = None
        if previous is not None and previous._catalogue is not None:
            self._base = (previous._state, previous._catalogue, previous._nested)
        self._nested: frozenset[str] = frozenset()  # known once every flow is decided
        # flow name -> (the flow judged, its decision); None: not registered
        self._decisions: dict[str, tuple[Flow, FlowDecision] | None] = {}
        self._catalogue: Catalogue | None = None
        self._published_tools: list[tuple[str, str, str]] | None = None
        self._lock = threading.Lock()
        self._grant_claims: frozenset[str] | None | bool = False  # False: not known yet
        self._may_collide = self._names_may_collide(previous)
        if self._may_collide:
            self.catalogue  # noqa: B018 - judge every flow now, so a collision fails here

    @property
    def sequence(self) -> int:
        """The registry sequence this snapshot was built for."""
        return self._state.sequence

    @property
    def grant_claims(self) -> frozenset[str] | None:
        """The claim names step grants read (:mod:`chainweaver.grants`), over every
        registered tool and flow version; None when nothing declares a grant, so that
        every caller shares one view. Worked out once per snapshot, from the
        declarations alone (no flow is judged)."""
        known = self._grant_claims
        if known is False:
            known = self._grant_claims = _declared_claims(self._executor, self._state)
        return known  # type: ignore[return-value]

    def _names_may_collide(self, previous: Exposure | None) -> bool:
        # Published names are tool_name, tool_name + "__" + prompt, the guide's and the
        # operator's prompts': they can only clash through a flow name holding "__", a
        # tool name too long to publish, or a flow published as the guide.
        prefix = self.policy.server_prefix
        longest = 64 - (len(prefix) + 2 if prefix else 0)
        if not prefix and GUIDE_PROMPT_NAME in self._state:
            return True
        names: Iterable[str] = self._state.flows
        if previous is not None:  # only names it has not seen can change its answer
            if previous._may_collide:
                return True
            names = self._state.flows.keys() - previous._state.flows.keys()
        return any("__" in name or len(name) > longest for name in names)

    # ------------------------------------------------------------- one flow

    def decision(self, flow_name: str) -> FlowDecision | None:
        """The memoised decision for a registered flow name (None: not registered)."""
        if flow_name in self._decisions:
            memo = self._decisions[flow_name]
            return memo[1] if memo else None
        flow = self._state.latest(flow_name)
        memo = None
        if flow is not None:
            decided = self._carried(flow) or decide_flow(
                self._executor, self.policy, flow, expose_schemas=self.expose_schemas,
                expose_prompts=self.expose_prompts,
                server_prompt_names=self._server_prompt_names)
            memo = (flow, decided)
        memo = self._decisions.setdefault(flow_name, memo)
        return memo[1] if memo else None

    def _carried(self, flow: Flow) -> FlowDecision | None:
        """The previous snapshot's decision about this very flow object, if still valid.

        Valid when the flow is the same object (a lifecycle move or a new version makes
        a new one) and has no sub-flow step: a sub-flow step's decision depends on
        other flows' lifecycles, so it is judged again.
        """
        memo = self._carry.get(flow.name)
        if memo is None or memo[0] is not flow or _has_sub_flow(flow):
            return None
        return memo[1]

    def flow(self, flow_name: str) -> ExposedFlow | None:
        """The exposed flow published for a flow name, or None."""
        decided = self.decision(flow_name)
        return decided.exposed if decided else None

    def tool(self, name: str) -> ExposedFlow | None:
        """The exposed flow behind a published tool name, or None."""
        prefix = self.policy.server_prefix
        if prefix:
            if not name.startswith(f"{prefix}__"):
                return None
            flow_name = name[len(prefix) + 2:]
        else:
            flow_name = name
        exposed = self.flow(flow_name)
        return exposed if exposed is not None and exposed.tool_name == name else None

    def resource(self, uri: str) -> ExposedFlow | None:
        """The exposed flow behind a schema resource URI, or None (the index too)."""
        if not self.expose_schemas or not (uri.startswith(_SCHEMA_PREFIX)
                                           and uri.endswith(_SCHEMA_SUFFIX)):
            return None
        exposed = self.tool(uri[len(_SCHEMA_PREFIX):len(uri) - len(_SCHEMA_SUFFIX)])
        return exposed if exposed is not None and exposed.schema_uri == uri else None

    def prompt(self, name: str) -> PromptEntry | None:
        """The published prompt of that name: server-level, the guide, or a flow's."""
        if not self.expose_prompts:
            return None
        if name in self._server_prompts:
            return PromptEntry(name, None, self._server_prompts[name])
        if name == GUIDE_PROMPT_NAME:
            return PromptEntry(name, None, None) if self._guide else None
        exposed = self.tool(name)
        if exposed is not None and exposed.invocation_prompt == name:
            return PromptEntry(name, exposed, None)
        # An authored prompt is "<tool name>__<prompt>"; tool names may hold "__" too.
        start = name.find("__")
        while start != -1:
            exposed = self.tool(name[:start])
            if exposed is not None and name in exposed.authored_prompts:
                return PromptEntry(name, exposed, exposed.authored_prompts[name])
            start = name.find("__", start + 1)
        return None

    # ---------------------------------------------------------- every flow

    def published_tools(self) -> list[tuple[str, str, str]]:
        """Each published tool's name, its flow's version and name, sorted: what a
        view that narrows nothing lists. Worked out once, judging each flow without
        building what it publishes (:func:`~.decision.judge_flow`), so that a list
        builds only its page's flows."""
        if self._published_tools is None:
            with self._lock:
                if self._published_tools is None:
                    self._published_tools = self._judge_all()
        return self._published_tools

    def _judge_all(self) -> list[tuple[str, str, str]]:
        if self._catalogue is not None:
            return sorted((name, exposed.flow.version, exposed.flow.name)
                          for name, exposed in self._catalogue.tools.items())
        published = []
        for name in self._state.flows:
            flow = self._state.latest(name)
            if flow is None:
                continue
            memo = self._decisions.get(name)
            if memo is None:
                # A decision not to publish is memoised (and logged) once, as
                # decision() would; one to publish is made when the flow is needed.
                decided = self._carried(flow) or judge_flow(self._executor, self.policy,
                                                            flow)
                if decided is not None:
                    memo = self._decisions.setdefault(name, (flow, decided))
            if memo is None or memo[1].exposed is not None:
                published.append((self.policy.tool_name(name), flow.version, name))
        published.sort()
        return published

    @property
    def catalogue(self) -> Catalogue:
        """Every registered flow decided (once), for lists, the report and the guide."""
        if self._catalogue is None:
            with self._lock:
                if self._catalogue is None:
                    self._catalogue = self._decide_all()
        return self._catalogue

    @_cyclic_gc_paused
    def _decide_all(self) -> Catalogue:
        catalogue = self._patched() if self._base is not None else self._decided_afresh()
        self._carry, self._base = {}, None
        return catalogue

    def _decided_afresh(self) -> Catalogue:
        catalogue = Catalogue()
        nested = []
        for name in sorted(self._state.flows):
            decided = self.decision(name)
            assert decided is not None
            catalogue.report.append(decided.report)
            if decided.exposed is not None:
                _add(catalogue, decided.exposed)
            if _has_sub_flow(self._state.flows[name][-1]):
                nested.append(name)
        self._nested = frozenset(nested)
        if self.expose_prompts:
            for prompt in self._server_prompts.values():
                catalogue.prompts[prompt.name] = PromptEntry(prompt.name, None, prompt)
            if self._guide:
                catalogue.prompts.setdefault(GUIDE_PROMPT_NAME,
                                             PromptEntry(GUIDE_PROMPT_NAME, None, None))
        return catalogue

    def _patched(self) -> Catalogue:
        """The previous catalogue with the flows that changed decided again.

        Changed: a name whose versions are not the same tuple (a registration, a
        lifecycle move, a removal), and every flow with a sub-flow step. Entries that
        (re)appear come after the others in lists; the report stays sorted by name.
        """
        assert self._base is not None
        state, previous, nested_before = self._base
        flows, before = self._state.flows, state.flows
        changed = {name for name, versions in flows.items() if before.get(name) is not versions}
        changed.update(name for name in before if name not in flows)
        changed.update(nested_before)
        # The decisions about unchanged flows stand: memoise them here too, so the
        # snapshot after this one can patch in turn.
        decisions = dict(self._carry)
        for name in changed:
            decisions.pop(name, None)
        decisions.update(self._decisions)
        self._decisions = decisions
        catalogue = Catalogue(list(previous.report), dict(previous.tools),
                              dict(previous.resources), dict(previous.prompts))
        report = catalogue.report
        for name in changed:
            memo = self._carry.get(name)
            if memo is not None and memo[1].exposed is not None:
                _remove(catalogue, memo[1].exposed)
            index = bisect.bisect_left(report, name, key=_flow_name)
            if index < len(report) and report[index].flow_name == name:
                del report[index]
        nested = set(nested_before)
        for name in sorted(changed):
            nested.discard(name)
            if name not in flows:
                continue
            decided = self.decision(name)
            assert decided is not None
            bisect.insort(report, decided.report, key=_flow_name)
            if decided.exposed is not None:
                _add(catalogue, decided.exposed)
            if _has_sub_flow(flows[name][-1]):
                nested.add(name)
        self._nested = frozenset(nested)
        return catalogue

    @property
    def report(self) -> list[FlowExposure]:
        return self.catalogue.report

    @property
    def tools(self) -> dict[str, ExposedFlow]:
        return self.catalogue.tools

    @property
    def resources(self) -> dict[str, ExposedFlow]:
        return self.catalogue.resources

    @property
    def prompts(self) -> dict[str, PromptEntry]:
        return self.catalogue.prompts

    @property
    def exposed_flows(self) -> list[ExposedFlow]:
        return list(self.catalogue.tools.values())


def _has_sub_flow(flow: Flow) -> bool:
    return any(step.flow is not None for step in flow.steps)


def _flow_name(entry: FlowExposure) -> str:
    return entry.flow_name


def _remove(catalogue: Catalogue, exposed: ExposedFlow) -> None:
    """Take an exposed flow's names out of the catalogue (see :func:`_add`)."""
    catalogue.tools.pop(exposed.tool_name, None)
    if exposed.schema_uri is not None:
        catalogue.resources.pop(exposed.schema_uri, None)
    for prompt_name in exposed.prompt_names:
        catalogue.prompts.pop(prompt_name, None)


def _add(catalogue: Catalogue, exposed: ExposedFlow) -> None:
    """Add an exposed flow's names to the catalogue; two flows may not share a prompt name.

    (Tool names cannot clash: each is the server prefix and a unique flow name.)
    """
    prompt_names = exposed.prompt_names
    for prompt_name in prompt_names:
        if prompt_name in catalogue.prompts:
            raise ExposureConfigError(
                f"prompt name {prompt_name!r} of flow {exposed.flow.name!r} collides with "
                "another flow's prompt")
    catalogue.tools[exposed.tool_name] = exposed
    if exposed.schema_uri is not None:
        catalogue.resources[exposed.schema_uri] = exposed
    for prompt_name in prompt_names:
        catalogue.prompts[prompt_name] = PromptEntry(
            prompt_name, exposed, exposed.authored_prompts.get(prompt_name))


def _declared_claims(executor: FlowExecutor, state: RegistryState
                     ) -> frozenset[str] | None:
    declared = [tool.requires for tool in executor.tools.values()]
    for versions in state.flows.values():
        for flow in versions:
            declared.append(flow.requires)
            declared.extend(step.requires for step in flow.steps)
    found = [grants for grants in declared if grants is not None]
    if not found:
        return None
    return frozenset(name for grants in found for name in grants.claims)
