"""The governance filter: ONE decision per registered flow, read by every primitive.

``decide_exposure`` turns the registry, the executor and the server's policy into an
:class:`Exposure`: for each flow name either the exposed version with all its
published names (tool, schema resource, prompts), or the reason it is excluded.
Tools, resources, templates, prompts, completions, the index, the guide and
``exposure_report()`` all look names up here and nowhere else.
"""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar, cast

from ..errors import ExposureConfigError
from ..executor import FlowExecutor
from ..flows import Flow, FlowLifecycle
from ..prompts import FlowPrompt
from ..safety import SideEffectLevel, ToolSafetyContract
from ..tools import NAME_PATTERN
from .config import ExposurePolicy
from .contract import ContractError, PublishedContract, build_contract

logger = logging.getLogger("chainweaver.mcp")

GUIDE_PROMPT_NAME = "chainweaver_guide"
INDEX_URI = "chainweaver://flows"


def schema_uri(tool_name: str) -> str:
    """Address of a flow's schema resource."""
    return f"chainweaver://flows/{tool_name}/schema"


@dataclass(frozen=True)
class ExposedFlow:
    """A flow that is published, with everything the primitives need to serve it."""

    flow: Flow
    tool_name: str
    safety: ToolSafetyContract | None
    forced: bool
    contract: PublishedContract
    schema_uri: str | None
    # published prompt name -> the flow's authored prompt (server overrides removed)
    authored_prompts: Mapping[str, FlowPrompt]
    invocation_prompt: str | None

    @property
    def prompt_names(self) -> list[str]:
        names = [self.invocation_prompt] if self.invocation_prompt else []
        return names + list(self.authored_prompts)


@dataclass(frozen=True)
class FlowExposure:
    """One line of ``exposure_report()``: a registered flow name and its fate."""

    flow_name: str
    version: str
    exposed: bool
    reason: str | None = None
    forced: bool = False
    tool_name: str | None = None
    resource_uris: tuple[str, ...] = ()
    prompt_names: tuple[str, ...] = ()
    overridden_prompts: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "flow_name": self.flow_name,
            "version": self.version,
            "exposed": self.exposed,
            "reason": self.reason,
            "forced": self.forced,
            "tool_name": self.tool_name,
            "resource_uris": list(self.resource_uris),
            "prompt_names": list(self.prompt_names),
            "overridden_prompts": list(self.overridden_prompts),
        }


@dataclass(frozen=True)
class PromptEntry:
    """A published prompt: schema-derived (``prompt`` None), authored, or server-level."""

    name: str
    exposed_flow: ExposedFlow | None
    prompt: FlowPrompt | None


@dataclass
class Exposure:
    """The single result every primitive reads."""

    policy: ExposurePolicy
    expose_schemas: bool = False
    expose_prompts: bool = False
    report: list[FlowExposure] = field(default_factory=list)
    tools: dict[str, ExposedFlow] = field(default_factory=dict)
    flows: dict[str, ExposedFlow] = field(default_factory=dict)  # by flow name
    resources: dict[str, ExposedFlow] = field(default_factory=dict)
    prompts: dict[str, PromptEntry] = field(default_factory=dict)

    @property
    def exposed_flows(self) -> list[ExposedFlow]:
        return list(self.tools.values())


def _exclusion_reason(
    flow: Flow, executor: FlowExecutor, policy: ExposurePolicy, safety: ToolSafetyContract | None
) -> str | None:
    governance = flow.governance
    # ExposurePolicy normalised these to frozensets when it was built.
    lifecycles = cast("frozenset[FlowLifecycle]", policy.allowed_lifecycles)
    side_effects = cast("frozenset[SideEffectLevel]", policy.allowed_side_effects)
    owners = cast("frozenset[str] | None", policy.owners)
    if governance.lifecycle not in lifecycles:
        allowed = ", ".join(sorted(x.value for x in lifecycles))
        return f"lifecycle {governance.lifecycle.value!r} is not allowed (allowed: {allowed})"
    if owners is not None and governance.owner not in owners:
        allowed = ", ".join(sorted(owners)) or "none"
        return f"owner {governance.owner!r} is not allowed (allowed: {allowed})"
    if safety is None:
        return ("effective safety is unknown: no safety contract on the flow or on "
                + ", ".join(_unknown_safety(flow, executor)))
    if safety.side_effects not in side_effects:
        allowed = ", ".join(x.value for x in sorted(side_effects))
        return (f"side effects {safety.side_effects.value!r} are not allowed "
                f"(allowed: {allowed})")
    if safety.requires_approval and not policy.allow_requires_approval:
        why = f" ({safety.approval_reason})" if safety.approval_reason else ""
        return f"requires approval{why} and allow_requires_approval is false"
    return None


def _unknown_safety(flow: Flow, executor: FlowExecutor) -> list[str]:
    """The tools (steps and fallbacks) and sub-flows whose safety is not known."""
    tools = executor.tools
    unknown_tools: list[str] = []
    unknown_flows: list[str] = []
    for step in flow.steps:
        if step.flow is not None:
            if step.flow not in executor.registry or executor.effective_safety(
                    executor.registry.get_flow(step.flow)) is None:
                unknown_flows.append(step.flow)
        for name in (step.tool_name, step.fallback):
            if name is not None and (name not in tools or tools[name].safety is None):
                unknown_tools.append(name)
    parts = []
    if unknown_tools:
        parts.append("tool(s) " + ", ".join(repr(n) for n in dict.fromkeys(unknown_tools)))
    if unknown_flows:
        parts.append("sub-flow(s) " + ", ".join(repr(n) for n in dict.fromkeys(unknown_flows)))
    return parts or [f"sub-flow(s) of {flow.name!r} (recursive)"]


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


@_cyclic_gc_paused
def decide_exposure(
    executor: FlowExecutor,
    policy: ExposurePolicy,
    *,
    expose_schemas: bool = False,
    expose_prompts: bool = False,
    server_prompts: Sequence[FlowPrompt] = (),
) -> Exposure:
    """Decide, once, what the server publishes. Raises ExposureConfigError on bad config."""
    registry = executor.registry
    if policy.flow_names is not None:
        unknown = sorted(n for n in policy.flow_names if n not in registry)
        if unknown:
            raise ExposureConfigError(
                f"flow_names names unregistered flow(s): {', '.join(unknown)}"
            )

    exposure = Exposure(policy, expose_schemas, expose_prompts)
    server_prompt_names = {p.name for p in server_prompts}
    if len(server_prompt_names) != len(server_prompts):
        raise ExposureConfigError("server-level prompts must have unique names")

    for name in registry.flow_names():
        flow = registry.get_flow(name)
        if policy.flow_names is not None and name not in policy.flow_names:
            exposure.report.append(FlowExposure(name, flow.version, False,
                                                "not listed in flow_names"))
            continue
        problems = executor.check_flow(flow)
        if problems:
            # A flow that cannot run is never published, forced or not.
            exposure.report.append(FlowExposure(name, flow.version, False,
                                                "flow is invalid: " + "; ".join(problems)))
            continue
        safety = executor.effective_safety(flow)
        reason = _exclusion_reason(flow, executor, policy, safety)
        forced = reason is not None and policy.force_expose
        if reason is not None and not forced:
            exposure.report.append(FlowExposure(name, flow.version, False, reason))
            continue
        try:
            contract = build_contract(executor, flow)
        except ContractError as unpublishable:
            # Publishing it would break tools/list for every flow, so never, forced or not.
            exposure.report.append(FlowExposure(name, flow.version, False,
                                                str(unpublishable)))
            continue
        if forced:
            logger.warning("force_expose publishes flow %r despite: %s", name, reason)
        _publish(exposure, flow, safety, forced, contract, server_prompt_names)

    if expose_prompts:
        for prompt in server_prompts:
            exposure.prompts[prompt.name] = PromptEntry(prompt.name, None, prompt)
        if GUIDE_PROMPT_NAME not in exposure.prompts:
            exposure.prompts[GUIDE_PROMPT_NAME] = PromptEntry(GUIDE_PROMPT_NAME, None, None)
    for entry in exposure.report:
        if not entry.exposed:
            logger.warning("flow %r v%s is not exposed: %s", entry.flow_name, entry.version,
                           entry.reason)
    return exposure


def _publish(
    exposure: Exposure,
    flow: Flow,
    safety: ToolSafetyContract | None,
    forced: bool,
    contract: PublishedContract,
    server_prompt_names: set[str],
) -> None:
    policy = exposure.policy
    tool_name = policy.tool_name(flow.name)
    if not NAME_PATTERN.fullmatch(tool_name):
        raise ExposureConfigError(
            f"published tool name {tool_name!r} for flow {flow.name!r} is not a valid MCP tool "
            "name (1-64 of letters, digits, '_', '-', '.'); shorten the prefix or the flow name"
        )
    if tool_name in exposure.tools:
        raise ExposureConfigError(f"two flows publish the tool name {tool_name!r}")

    uri = schema_uri(tool_name) if exposure.expose_schemas else None
    invocation = None
    authored: dict[str, FlowPrompt] = {}
    overridden: list[str] = []
    if exposure.expose_prompts:
        published = {tool_name: None} | {f"{tool_name}__{p.name}": p for p in flow.prompts}
        for prompt_name, prompt in published.items():
            if prompt_name == GUIDE_PROMPT_NAME and prompt_name not in server_prompt_names:
                raise ExposureConfigError(
                    f"prompt name {prompt_name!r} of flow {flow.name!r} is reserved for the "
                    "guide prompt; rename the flow or set server_prefix"
                )
            if prompt_name in exposure.prompts:
                raise ExposureConfigError(
                    f"prompt name {prompt_name!r} of flow {flow.name!r} collides with "
                    f"another flow's prompt"
                )
            if prompt_name in server_prompt_names:
                overridden.append(prompt_name)  # the operator's prompt takes this name
            elif prompt is None:
                invocation = prompt_name
            else:
                authored[prompt_name] = prompt
    exposed = ExposedFlow(flow, tool_name, safety, forced, contract, uri, authored, invocation)

    exposure.tools[tool_name] = exposed
    exposure.flows[flow.name] = exposed
    if uri is not None:
        exposure.resources[uri] = exposed
    for prompt_name in exposed.prompt_names:
        exposure.prompts[prompt_name] = PromptEntry(
            prompt_name, exposed, authored.get(prompt_name)
        )
    exposure.report.append(FlowExposure(
        flow.name, flow.version, True, None, forced, tool_name,
        (uri,) if uri else (), tuple(exposed.prompt_names), tuple(overridden),
    ))
