"""Shared governance as data: what operators decided per flow, and what it makes of a flow.

The shared state is an overlay on each process's own flows (from its code and files):
per flow name, a decision for all versions and decisions for single versions. A flow
version takes the decision for its version, else the one for all versions, else keeps
the governance its definition gives it. Pure data and pure functions: no Redis here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, cast

from chainweaver.errors import ExposureConfigError
from chainweaver.flows import Flow, FlowLifecycle
from chainweaver.versions import version_key

Action = Literal["active", "deprecated", "archived", "withdrawn"]
ACTIONS: tuple[Action, ...] = ("active", "deprecated", "archived", "withdrawn")
# What a deprecated flow's published description starts with: clients are told (its
# tool changed) and a model reading the list sees it.
DEPRECATED_NOTE = "Deprecated: "
DEFAULT_PREFIX = "chainweaver:governance"


@dataclass(frozen=True)
class Decision:
    """What operators decided for one flow name: ``all`` versions, and single ones."""

    all: Action | None = None
    versions: Mapping[str, Action] = field(default_factory=dict)

    def for_version(self, version: str) -> Action | None:
        """The decision for ``version`` (compared as versions: 1.0 == 1.0.0)."""
        if self.versions:
            key = version_key(version)
            for given, action in self.versions.items():
                if version_key(given) == key:
                    return action
        return self.all

    @classmethod
    def from_json(cls, text: str | bytes) -> Decision:
        data = json.loads(text)
        return cls(_action(data.get("all")),
                   {str(v): cast(Action, _action(a)) for v, a in
                    (data.get("versions") or {}).items()})


def _action(value: object) -> Action | None:
    if value is None or value in ACTIONS:
        return cast("Action | None", value)
    raise ValueError(f"unknown governance action {value!r}")


@dataclass(frozen=True)
class SharedState:
    """The shared decisions at one ``version`` of the shared counter."""

    version: int = 0
    decisions: Mapping[str, Decision] = field(
        default_factory=lambda: MappingProxyType({}))


def governed(flow: Flow, action: Action | None) -> Flow | None:
    """``flow`` as ``action`` makes it (itself when nothing changes; None: withdrawn).

    ``active`` and ``archived`` set the lifecycle as written, like a flow file edit
    (the lifecycle transition rules guard local ``set_lifecycle`` calls, not an
    operator's decision); ``deprecated`` keeps the flow active and marks its
    description.
    """
    if action is None:
        return flow
    if action == "withdrawn":
        return None
    lifecycle = FlowLifecycle.ARCHIVED if action == "archived" else FlowLifecycle.ACTIVE
    description = flow.description
    if action == "deprecated" and not description.startswith(DEPRECATED_NOTE):
        description = DEPRECATED_NOTE + description
    if flow.governance.lifecycle is lifecycle and description == flow.description:
        return flow
    return dataclasses.replace(
        flow, description=description,
        governance=dataclasses.replace(flow.governance, lifecycle=lifecycle))


def check_version(version: str | None) -> str | None:
    """A version given to a command: None (all versions) or a valid version string."""
    if version is not None:
        version_key(version)  # raises InvalidVersionError naming the value
    return version


@dataclass(frozen=True)
class GovernanceSettings:
    """Where the shared governance state lives and how a process follows it.

    ``url``: ``redis://`` / ``rediss://`` (needs the ``tasks`` extra, which brings
    ``redis``). ``prefix``: the Redis key prefix (several deployments on one Redis use
    different ones). Changes arrive by publish/subscribe; every ``confirm_interval``
    seconds the process also compares the shared version counter with the version it
    applied, so a missed message is caught. ``heartbeat_interval``: how often it
    records what it applied (``chainweaver flows status``). ``stop_serving_after``
    (seconds, default None: never): when the state could not be confirmed for that
    long (Redis unreachable), serve no flow until it can. ``replica``: the name
    status shows (default ``host:pid``).
    """

    url: str
    prefix: str = DEFAULT_PREFIX
    confirm_interval: float = 1.0
    heartbeat_interval: float = 2.0
    stop_serving_after: float | None = None
    replica: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("redis://",
                                                                     "rediss://")):
            raise ExposureConfigError(
                f"governance must be a URL starting with redis:// or rediss://, got "
                f"{self.url!r}")
        for name in ("prefix", "replica"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ExposureConfigError(f"{name} must be a non-empty string, got {value!r}")
        for name in ("confirm_interval", "heartbeat_interval", "stop_serving_after"):
            value = getattr(self, name)
            if value is None and name == "stop_serving_after":
                continue
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value) or value <= 0):
                raise ExposureConfigError(
                    f"{name} must be a number of seconds > 0, got {value!r}")


def check_governance(value: object) -> GovernanceSettings | None:
    """``ServingConfig(governance=...)``: None, a Redis URL or :class:`GovernanceSettings`."""
    if value is None or isinstance(value, GovernanceSettings):
        return value
    if isinstance(value, str):
        return GovernanceSettings(url=value)
    raise ExposureConfigError(
        f"governance must be None, a redis:// URL or a GovernanceSettings, got {value!r}")
