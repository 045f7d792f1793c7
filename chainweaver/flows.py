"""Flows: versioned, governed sequences of tool steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType

from pydantic import BaseModel

from .errors import DefinitionError, LifecycleTransitionError, PromptDefinitionError
from .prompts import FlowPrompt, repeated_names
from .safety import ToolSafetyContract
from .tools import check_model, check_name
from .versions import version_key


class FlowLifecycle(Enum):
    """Where a flow stands in review: ``draft -> reviewed -> active -> archived``."""

    DRAFT = "draft"
    REVIEWED = "reviewed"
    ACTIVE = "active"
    ARCHIVED = "archived"

    def __str__(self) -> str:
        return self.value


# A reviewed flow may go back to draft for changes; archiving is final.
ALLOWED_TRANSITIONS: Mapping[FlowLifecycle, frozenset[FlowLifecycle]] = MappingProxyType({
    FlowLifecycle.DRAFT: frozenset({FlowLifecycle.REVIEWED, FlowLifecycle.ARCHIVED}),
    FlowLifecycle.REVIEWED: frozenset(
        {FlowLifecycle.DRAFT, FlowLifecycle.ACTIVE, FlowLifecycle.ARCHIVED}
    ),
    FlowLifecycle.ACTIVE: frozenset({FlowLifecycle.ARCHIVED}),
    FlowLifecycle.ARCHIVED: frozenset(),
})


@dataclass(frozen=True)
class FlowGovernance:
    """Who owns a flow and where it is in its lifecycle."""

    lifecycle: FlowLifecycle = FlowLifecycle.ACTIVE
    owner: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lifecycle", FlowLifecycle(self.lifecycle))

    def transition(self, target: FlowLifecycle | str) -> FlowGovernance:
        """Return a new governance value in ``target``, if the move is allowed."""
        target = FlowLifecycle(target)
        if target not in ALLOWED_TRANSITIONS[self.lifecycle]:
            allowed = ", ".join(sorted(t.value for t in ALLOWED_TRANSITIONS[self.lifecycle]))
            raise LifecycleTransitionError(
                f"cannot move a flow from {self.lifecycle.value!r} to {target.value!r}"
                f" (allowed: {allowed or 'none'})"
            )
        return replace(self, lifecycle=target)


@dataclass(frozen=True)
class FlowStep:
    """One step: the tool to call and how its input fields map to context keys.

    ``input_mapping`` maps a tool input field to the context key that feeds it;
    fields not in the mapping receive the context key of the same name, if any.
    """

    tool_name: str
    input_mapping: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("tool", self.tool_name)
        mapping = dict(self.input_mapping)
        for source, target in mapping.items():
            if not isinstance(source, str) or not isinstance(target, str):
                raise DefinitionError(
                    f"step {self.tool_name!r}: input_mapping keys and values must be strings"
                )
        object.__setattr__(self, "input_mapping", MappingProxyType(mapping))


@dataclass(frozen=True)
class Flow:
    """A named, versioned sequence of tool steps with governance and safety metadata."""

    name: str
    description: str
    steps: Sequence[FlowStep]
    version: str = "1.0.0"
    title: str | None = None
    input_schema: type[BaseModel] | None = None
    output_schema: type[BaseModel] | None = None
    governance: FlowGovernance = field(default_factory=FlowGovernance)
    safety: ToolSafetyContract | None = None
    prompts: Sequence[FlowPrompt] = ()

    def __post_init__(self) -> None:
        check_name("flow", self.name)
        version_key(self.version)  # raises InvalidVersionError
        steps = tuple(self.steps)
        if not steps:
            raise DefinitionError(f"flow {self.name!r} needs at least one step")
        if not all(isinstance(step, FlowStep) for step in steps):
            raise DefinitionError(f"flow {self.name!r}: steps must be FlowStep values")
        object.__setattr__(self, "steps", steps)
        check_model(f"flow {self.name!r}", "input_schema", self.input_schema, optional=True)
        check_model(f"flow {self.name!r}", "output_schema", self.output_schema, optional=True)
        if not isinstance(self.governance, FlowGovernance):
            raise DefinitionError(f"flow {self.name!r}: governance must be a FlowGovernance")
        if self.safety is not None and not isinstance(self.safety, ToolSafetyContract):
            raise DefinitionError(f"flow {self.name!r}: safety must be a ToolSafetyContract")
        prompts = tuple(self.prompts)
        if not all(isinstance(p, FlowPrompt) for p in prompts):
            raise PromptDefinitionError(f"flow {self.name!r}: prompts must be FlowPrompt values")
        duplicates = repeated_names(p.name for p in prompts)
        if duplicates:
            raise PromptDefinitionError(
                f"flow {self.name!r}: duplicate prompt name(s) {', '.join(duplicates)}"
            )
        object.__setattr__(self, "prompts", prompts)

    @property
    def version_key(self) -> tuple:
        return version_key(self.version)

    @property
    def display_title(self) -> str:
        """``title``, or the name made readable (``order_lookup`` -> ``Order Lookup``)."""
        if self.title:
            return self.title
        return " ".join(w.capitalize() for w in self.name.replace("-", "_").replace(".", "_")
                        .split("_") if w)
