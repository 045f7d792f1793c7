"""The governance filter's result: what a server publishes, read by every primitive.

An :class:`Exposure` answers "is this published, and as what?" for a tool name, a
resource URI, a prompt name or a flow name by judging just the flow concerned
(:func:`~.decision.decide_flow`, memoised), so a server starts and looks names up
without visiting the catalogue. Lists, ``exposure_report()``, the index and the guide
read the :class:`Catalogue`: every flow decided, once, on first need. Both views come
from the same memoised decisions, so they always agree.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from ..errors import ExposureConfigError
from ..executor import FlowExecutor
from ..prompts import FlowPrompt
from .config import ExposurePolicy
from .decision import (
    GUIDE_PROMPT_NAME,
    INDEX_URI,
    ExposedFlow,
    FlowDecision,
    FlowExposure,
    PromptEntry,
    decide_flow,
    schema_uri,
)

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

    Construction checks what can be checked without judging every flow, and judges
    every flow at once only when names could collide (a flow name holding ``__``, a
    tool name too long, the guide's name): then a collision raises
    :class:`ExposureConfigError` here, never on a request.
    """

    def __init__(
        self,
        executor: FlowExecutor,
        policy: ExposurePolicy,
        *,
        expose_schemas: bool = False,
        expose_prompts: bool = False,
        server_prompts: Sequence[FlowPrompt] = (),
    ) -> None:
        self.policy = policy
        self.expose_schemas = expose_schemas
        self.expose_prompts = expose_prompts
        self._executor = executor
        self._server_prompts = {p.name: p for p in server_prompts}
        self._server_prompt_names = frozenset(self._server_prompts)
        if len(self._server_prompts) != len(server_prompts):
            raise ExposureConfigError("server-level prompts must have unique names")
        registry = executor.registry
        if policy.flow_names is not None:
            unknown = sorted(n for n in policy.flow_names if n not in registry)
            if unknown:
                raise ExposureConfigError(
                    f"flow_names names unregistered flow(s): {', '.join(unknown)}")
        # The registry as it stands now is what this exposure decides about, even for
        # flows it judges later: a flow or version registered afterwards is not part of it.
        self._as_of = registry.sequence
        self._decisions: dict[str, FlowDecision | None] = {}
        self._catalogue: Catalogue | None = None
        self._lock = threading.Lock()
        if self._names_may_collide():
            self.catalogue  # noqa: B018 - judge every flow now, so a collision fails here

    def _names_may_collide(self) -> bool:
        # Published names are tool_name, tool_name + "__" + prompt, the guide's and the
        # operator's prompts': they can only clash through a flow name holding "__", a
        # tool name too long to publish, or a flow published as the guide.
        prefix = self.policy.server_prefix
        longest = 64 - (len(prefix) + 2 if prefix else 0)
        if not prefix and GUIDE_PROMPT_NAME in self._executor.registry:
            return True
        return any("__" in name or len(name) > longest
                   for name in self._executor.registry.names())

    # ------------------------------------------------------------- one flow

    def decision(self, flow_name: str) -> FlowDecision | None:
        """The memoised decision for a registered flow name (None: not registered)."""
        if flow_name in self._decisions:
            return self._decisions[flow_name]
        flow = self._executor.registry.get_flow_as_of(flow_name, self._as_of)
        decided = None
        if flow is not None:
            decided = decide_flow(self._executor, self.policy, flow,
                                  expose_schemas=self.expose_schemas,
                                  expose_prompts=self.expose_prompts,
                                  server_prompt_names=self._server_prompt_names)
        return self._decisions.setdefault(flow_name, decided)

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
            return PromptEntry(name, None, None)
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
        catalogue = Catalogue()
        for name in self._executor.registry.names_as_of(self._as_of):
            decided = self.decision(name)
            assert decided is not None
            catalogue.report.append(decided.report)
            if decided.exposed is not None:
                _add(catalogue, decided.exposed)
        if self.expose_prompts:
            for prompt in self._server_prompts.values():
                catalogue.prompts[prompt.name] = PromptEntry(prompt.name, None, prompt)
            catalogue.prompts.setdefault(GUIDE_PROMPT_NAME,
                                         PromptEntry(GUIDE_PROMPT_NAME, None, None))
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


def _add(catalogue: Catalogue, exposed: ExposedFlow) -> None:
    """Add an exposed flow's names to the catalogue; two flows may not share a prompt name.

    (Tool names cannot clash: each is the server prefix and a unique flow name.)
    """
    for prompt_name in exposed.prompt_names:
        if prompt_name in catalogue.prompts:
            raise ExposureConfigError(
                f"prompt name {prompt_name!r} of flow {exposed.flow.name!r} collides with "
                "another flow's prompt")
    catalogue.tools[exposed.tool_name] = exposed
    if exposed.schema_uri is not None:
        catalogue.resources[exposed.schema_uri] = exposed
    for prompt_name in exposed.prompt_names:
        catalogue.prompts[prompt_name] = PromptEntry(
            prompt_name, exposed, exposed.authored_prompts.get(prompt_name))
