"""The one reference to a server's current exposure snapshot, swapped when governance,
the registry or the policy changes (:mod:`chainweaver.mcp.live`), and read pinned to a
request's snapshot."""

from __future__ import annotations

from collections.abc import Callable

from chainweaver.mcp.config import ExposurePolicy
from chainweaver.mcp.publish.decision import ExposedFlow, FlowDecision, FlowExposure, PromptEntry
from chainweaver.mcp.publish.exposure import Catalogue, Exposure


class LiveExposure:
    """The one reference to a server's current :class:`Exposure`, swapped on change.

    A request pins the snapshot current when it starts (the security gate's first step
    does, in the request's admission: ``chainweaver.mcp.gate.admission``) and every
    read during that request answers from it, to the end; ``pinned`` reads that pin.
    Outside a request (reports, background work) reads answer from the latest
    snapshot. It answers like an :class:`Exposure`.
    """

    def __init__(self, exposure: Exposure,
                 pinned: Callable[[LiveExposure], Exposure | None] | None = None) -> None:
        self._latest = exposure
        self._pinned = pinned

    @property
    def latest(self) -> Exposure:
        """The newest snapshot, whatever the current request pinned."""
        return self._latest

    def swap(self, exposure: Exposure) -> None:
        """Make ``exposure`` the snapshot every request starting from now on uses."""
        self._latest = exposure  # one reference assignment: atomic for readers

    @property
    def current(self) -> Exposure:
        """The snapshot this request pinned, else the latest."""
        pinned = self._pinned(self) if self._pinned is not None else None
        return pinned if pinned is not None else self._latest

    # Exposure's reading API, answered from the current snapshot.

    @property
    def policy(self) -> ExposurePolicy:
        return self.current.policy

    @property
    def expose_schemas(self) -> bool:
        return self.current.expose_schemas

    @property
    def expose_prompts(self) -> bool:
        return self.current.expose_prompts

    @property
    def sequence(self) -> int:
        return self.current.sequence

    @property
    def grant_claims(self) -> frozenset[str] | None:
        return self.current.grant_claims

    def decision(self, flow_name: str) -> FlowDecision | None:
        return self.current.decision(flow_name)

    def flow(self, flow_name: str) -> ExposedFlow | None:
        return self.current.flow(flow_name)

    def tool(self, name: str) -> ExposedFlow | None:
        return self.current.tool(name)

    def resource(self, uri: str) -> ExposedFlow | None:
        return self.current.resource(uri)

    def prompt(self, name: str) -> PromptEntry | None:
        return self.current.prompt(name)

    @property
    def catalogue(self) -> Catalogue:
        return self.current.catalogue

    @property
    def report(self) -> list[FlowExposure]:
        return self.current.report

    @property
    def tools(self) -> dict[str, ExposedFlow]:
        return self.current.tools

    @property
    def resources(self) -> dict[str, ExposedFlow]:
        return self.current.resources

    @property
    def prompts(self) -> dict[str, PromptEntry]:
        return self.current.prompts

    @property
    def exposed_flows(self) -> list[ExposedFlow]:
        return self.current.exposed_flows
