"""Shared governance as data: what operators decided per flow, and what it makes of a flow.

The shared state is an overlay on each process's own flows (from its code and files):
per flow name, a decision for all versions and decisions for single versions. A flow
version takes the decision for its version, else the one for all versions, else keeps
the governance its definition gives it. An entry a process cannot read (an action a
newer release wrote, a value that is not JSON, a key that is not a version) withholds
its flow: served nowhere, never "as defined". Pure data and pure functions: no Redis
here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, cast

from chainweaver.errors import ExposureConfigError
from chainweaver.flows import Flow, FlowLifecycle
from chainweaver.versions import VersionKey, version_key

Action = Literal["active", "deprecated", "archived", "withdrawn"]
ACTIONS: tuple[Action, ...] = ("active", "deprecated", "archived", "withdrawn")
# Two spellings of one version in one entry (only releases before versions were
# normalised on write stored them) cannot be ordered: the more restrictive one wins.
_RESTRICTIVENESS = {"active": 0, "deprecated": 1, "archived": 2, "withdrawn": 3}
_ENTRY_FIELDS = frozenset({"all", "versions"})
# What a deprecated flow's published description starts with: clients are told (its
# tool changed) and a model reading the list sees it.
DEPRECATED_NOTE = "Deprecated: "
DEFAULT_PREFIX = "chainweaver:governance"
UNREADABLE = "withheld by shared governance: its entry cannot be read"


class UnreadableEntry(ValueError):
    """A stored decision this release cannot read (the reason is the message)."""


@dataclass(frozen=True)
class Decision:
    """What operators decided for one flow name: ``all`` versions, and single ones.

    ``versions`` holds one spelling per version (compared as versions: ``1.0`` is
    ``1.0.0``). ``withheld`` (a reason) serves no version of the flow at all: what a
    process makes of an entry it cannot read.
    """

    all: Action | None = None
    versions: Mapping[str, Action] = field(default_factory=dict)
    withheld: str | None = None
    _by_key: Mapping[VersionKey, Action] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_action(self.all, optional=True)
        by_key: dict[VersionKey, tuple[str, Action]] = {}
        for given, action in self.versions.items():
            check_action(action)
            key = version_key(given)  # InvalidVersionError names the value
            kept = by_key.get(key)
            if kept is None or _RESTRICTIVENESS[action] > _RESTRICTIVENESS[kept[1]]:
                by_key[key] = (given.strip(), action)
        object.__setattr__(self, "versions", MappingProxyType(dict(by_key.values())))
        object.__setattr__(self, "_by_key", MappingProxyType(
            {key: action for key, (_, action) in by_key.items()}))

    def for_version(self, version: str) -> Action | None:
        """The decision for ``version`` (compared as versions: 1.0 == 1.0.0)."""
        if self._by_key:
            action = self._by_key.get(version_key(version))
            if action is not None:
                return action
        return self.all

    def govern(self, flow: Flow) -> Flow | None:
        """``flow`` as this decision makes it (None: withdrawn)."""
        if self.withheld is not None:
            return withheld(flow, self.withheld)
        return governed(flow, self.for_version(flow.version))

    def to_dict(self) -> dict[str, Any]:
        """The decision as stored (``all``, ``versions``)."""
        return {"all": self.all, "versions": dict(self.versions)}

    @classmethod
    def from_json(cls, text: str | bytes) -> Decision:
        """A stored entry; :class:`UnreadableEntry` says why one cannot be read."""
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise UnreadableEntry("not UTF-8 text") from None
        try:
            data = json.loads(text)
        except ValueError:
            raise UnreadableEntry("not JSON") from None
        except RecursionError:  # deeper than the decoder goes: not an outage
            raise UnreadableEntry("JSON nested too deep") from None
        if not isinstance(data, dict):
            raise UnreadableEntry("not a JSON object")
        unknown = sorted(set(data) - _ENTRY_FIELDS)
        if unknown:
            raise UnreadableEntry(f"unknown field(s) {', '.join(map(repr, unknown))} "
                                  f"(written by a newer release?)")
        versions = data.get("versions") or {}  # Lua's cjson writes an empty table as {}
        if not isinstance(versions, dict):
            raise UnreadableEntry("'versions' is not a JSON object")
        try:
            return cls(data.get("all"), versions)
        except (ValueError, TypeError) as error:  # InvalidVersionError is a ValueError
            raise UnreadableEntry(str(error)) from None


def read_entry(text: str | bytes) -> Decision:
    """A stored entry as the decision it governs by: one that cannot be read withholds
    every version of its flow (never "as defined")."""
    try:
        return Decision.from_json(text)
    except UnreadableEntry as error:
        return Decision(withheld=f"{UNREADABLE} ({_shortened(str(error))})")


def _shortened(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def check_action(value: object, *, optional: bool = False) -> Action | None:
    """``value`` if it is an action this release knows; ValueError naming it otherwise."""
    if (value is None and optional) or value in ACTIONS:
        return cast("Action | None", value)
    raise ValueError(f"unknown governance action {_shortened(repr(value), 60)} "
                     f"(known: {', '.join(ACTIONS)})")


@dataclass(frozen=True)
class SharedState:
    """The shared decisions at one ``version`` of the shared counter."""

    version: int = 0
    decisions: Mapping[str, Decision] = field(
        default_factory=lambda: MappingProxyType({}))

    @property
    def unreadable(self) -> dict[str, str]:
        """Flow name -> why its entry cannot be read (the flow is withheld)."""
        return {name: decision.withheld for name, decision in sorted(self.decisions.items())
                if decision.withheld is not None}


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


def withheld(flow: Flow, reason: str) -> Flow:
    """``flow`` served nowhere: archived (so no other flow runs it as a sub-flow) and
    marked ``withheld`` (so no policy publishes it, ``force_expose`` included)."""
    governance = flow.governance
    if governance.withheld == reason and governance.lifecycle is FlowLifecycle.ARCHIVED:
        return flow
    return dataclasses.replace(flow, governance=dataclasses.replace(
        governance, lifecycle=FlowLifecycle.ARCHIVED, withheld=reason))


def masked_url(url: str) -> str:
    """``url`` as logs and commands show it: any password replaced by ``***``
    (``redis://user:secret@host`` and ``redis://host/0?password=secret`` alike)."""
    scheme, sep, rest = url.partition("://")
    rest, question, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    auth, at, host = netloc.rpartition("@")
    if at and ":" in auth:
        netloc = f"{auth.split(':', 1)[0]}:***@{host}"
    if question:
        query = "&".join("password=***" if part.lower().startswith("password=") else part
                         for part in query.split("&"))
    return f"{scheme}{sep}{netloc}{slash}{path}{question}{query}"


def masked_reason(error: BaseException, url: str) -> str:
    """Why a store failed, for operators: the error's kind and text, with no password
    of ``url`` in it."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return _shortened(text, 300)


def _secrets(url: str) -> list[str]:
    """The passwords ``url`` spells (after ``user:`` and in ``?password=``), raw and
    decoded, longest first."""
    found = []
    rest, _, query = url.partition("://")[2].partition("?")
    auth, at, _ = rest.partition("/")[0].rpartition("@")
    if at and ":" in auth:
        found.append(auth.split(":", 1)[1])
    found += [part.split("=", 1)[1] for part in query.split("&")
              if part.lower().startswith("password=")]
    found += [urllib.parse.unquote(secret) for secret in found]
    return sorted({secret for secret in found if secret}, key=len, reverse=True)


def check_version(version: str | None) -> str | None:
    """A version given to a command: None (all versions) or a valid version string
    (stripped of surrounding spaces)."""
    if version is not None:
        version_key(version)  # raises InvalidVersionError naming the value
        version = version.strip()
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
    long (Redis unreachable), serve no flow until it can (a process that has not read
    the state since it started serves none, with or without it). ``replica``: the name
    status shows, one per process (default ``host:pid:`` and six random hex digits,
    new with every start).
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
            shown = masked_url(self.url) if isinstance(self.url, str) else self.url
            raise ExposureConfigError(
                f"governance must be a URL starting with redis:// or rediss://, got "
                f"{shown!r}")
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
    """``FlowServer(governance=...)``: None, a Redis URL or :class:`GovernanceSettings`."""
    if value is None or isinstance(value, GovernanceSettings):
        return value
    if isinstance(value, str):
        return GovernanceSettings(url=value)
    raise ExposureConfigError(
        f"governance must be None, a redis:// URL or a GovernanceSettings, got {value!r}")
