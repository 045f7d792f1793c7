"""The governance rule for ONE flow: published (with its names and contract) or not, and why.

``decide_flow`` is the only place that judges a flow; :class:`~.exposure.Exposure`
applies it to each flow name when that flow is first needed, and memoises it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from chainweaver.errors import ExposureConfigError
from chainweaver.executor import FlowExecutor
from chainweaver.flows import Flow, FlowLifecycle
from chainweaver.grants import Grants
from chainweaver.mcp.config import ExposurePolicy
from chainweaver.mcp.publish.contract import ContractError, PublishedContract, build_contract
from chainweaver.plan import Plan
from chainweaver.prompts import FlowPrompt
from chainweaver.run_events import approval_request
from chainweaver.safety import SideEffectLevel, ToolSafetyContract
from chainweaver.tools import NAME_PATTERN

logger = logging.getLogger("chainweaver.mcp")

GUIDE_PROMPT_NAME = "chainweaver_guide"
INDEX_URI = "chainweaver://flows"
# The reason of a flow whose own governance vetoes publishing (no policy overrides it).
OPTED_OUT = "the flow opts out of publishing (governance publish: false)"


def schema_uri(tool_name: str) -> str:
    """Address of a flow's schema resource."""
    return f"chainweaver://flows/{tool_name}/schema"


class PlanOnce:
    """A flow's plan, compiled at most once and then carried.

    Given the plan (the decision compiled it) or the executor to compile it with on
    first use: the decision compiles no plan for a flow it could show clean without one
    (``FlowExecutor.clean_input_model``: tool steps only, so its plan depends on
    nothing registered later).
    """

    __slots__ = ("_plan", "_executor", "_flow")
    _lock = threading.Lock()  # first uses in worker threads compile it once

    def __init__(self, plan: Plan | None = None, *, executor: FlowExecutor | None = None,
                 flow: Flow | None = None) -> None:
        self._plan = plan
        self._executor = executor
        self._flow = flow

    def get(self) -> Plan:
        plan = self._plan
        if plan is None:
            with self._lock:
                if self._plan is None:
                    assert self._executor is not None and self._flow is not None
                    self._plan = self._executor.plan(self._flow)
                    self._executor = self._flow = None
                plan = self._plan
        return plan


@dataclass(frozen=True)
class ExposedFlow:
    """A flow that is published, with everything the primitives need to serve it."""

    flow: Flow
    tool_name: str
    safety: ToolSafetyContract | None
    forced: bool
    contract: PublishedContract
    # The plan this decision reviewed (sub-flow versions included): calls run exactly it,
    # whatever is registered later. Read it as ``plan``.
    planned: PlanOnce = field(repr=False, compare=False)
    schema_uri: str | None
    # published prompt name -> the flow's authored prompt (server overrides removed)
    authored_prompts: Mapping[str, FlowPrompt]
    invocation_prompt: str | None
    # Calls ask the user to approve the run first (policy approval="elicit").
    needs_approval: bool = False
    # Background tasks: "forbidden", "optional" or "required" (the flow's own mode, or
    # the server's default); what the tool advertises and the task engine obeys.
    task_mode: str = "forbidden"

    @property
    def plan(self) -> Plan:
        """The flow's plan (compiled on first use when the decision needed none)."""
        return self.planned.get()

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
    needs_approval: bool = False  # each call asks the user first
    # (prompt name, why it is not published) for each prompt the prompt policy withholds
    withheld_prompts: tuple[tuple[str, str], ...] = ()
    # Set when the flow's file was edited but the edit could not be loaded: what is
    # described here is the last good version, and this says why (``serve --watch``).
    stale: str | None = None
    # Step grants (docs/step-grants.md): what a caller must hold to see and run it (a
    # caller lacking any of it does not see the flow), and each step the flow runs
    # beyond its caller's grants: (step path, the delegation's reason).
    requires: Grants | None = None
    delegations: tuple[tuple[str, str], ...] = ()

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
            "needs_approval": self.needs_approval,
            "withheld_prompts": dict(self.withheld_prompts),
            "stale": self.stale,
            "requires": self.requires.to_dict() if self.requires is not None else None,
            "delegations": dict(self.delegations),
        }


@dataclass(frozen=True)
class PromptEntry:
    """A published prompt: schema-derived (``prompt`` None), authored, or server-level."""

    name: str
    exposed_flow: ExposedFlow | None
    prompt: FlowPrompt | None


@dataclass(frozen=True)
class FlowDecision:
    """The decision for one registered flow name: its report line, and what it publishes."""

    report: FlowExposure
    exposed: ExposedFlow | None


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
    if flow.task_mode == "required" and policy.task_mode is None:
        return "it runs only as a background task, and the server has no task backend"
    if safety is None:
        return ("effective safety is unknown: no safety contract on the flow or on "
                + ", ".join(_unknown_safety(flow, executor)))
    if safety.side_effects not in side_effects:
        allowed = ", ".join(x.value for x in sorted(side_effects))
        return (f"side effects {safety.side_effects.value!r} are not allowed "
                f"(allowed: {allowed})")
    if safety.requires_approval and not policy.allow_requires_approval \
            and policy.approval != "elicit":
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
            # The version a sub-flow step runs: the latest active one.
            sub_flow = executor.registry.latest_active(step.flow)
            if sub_flow is None or executor.effective_safety(sub_flow) is None:
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


def decide_flow(
    executor: FlowExecutor,
    policy: ExposurePolicy,
    flow: Flow,
    *,
    expose_schemas: bool,
    expose_prompts: bool,
    server_prompt_names: frozenset[str],
) -> FlowDecision:
    """Judge one flow (the latest registered version of its name).

    Raises :class:`ExposureConfigError` for a flow that would be published under a name
    that is not a valid tool name, or under the reserved guide prompt name.
    """
    judged = _judged(executor, policy, flow)
    if isinstance(judged, FlowDecision):
        return judged
    input_model, plan, safety, reason, contract = judged
    planned = PlanOnce(plan) if plan is not None else PlanOnce(executor=executor, flow=flow)
    forced = reason is not None
    if forced:
        logger.warning("force_expose publishes flow %r despite: %s", flow.name, reason)
    exposed, overridden, withheld = _exposed_flow(policy, flow, safety, forced, contract,
                                                  planned, expose_schemas,
                                                  expose_prompts, server_prompt_names,
                                                  None if input_model is None else executor)
    # A flow shown clean without its plan declares no grant (clean_input_model says so).
    report = FlowExposure(flow.name, flow.version, True, None, forced, exposed.tool_name,
                          (exposed.schema_uri,) if exposed.schema_uri else (),
                          tuple(exposed.prompt_names), overridden, exposed.needs_approval,
                          withheld, requires=plan.required if plan is not None else None,
                          delegations=delegated_steps(plan))
    return FlowDecision(report, exposed)


def judge_flow(executor: FlowExecutor, policy: ExposurePolicy, flow: Flow
               ) -> FlowDecision | None:
    """Whether :func:`decide_flow` publishes ``flow``, without building what it
    publishes: None when it does, else its decision (not published, and why).

    The same judgement as :func:`decide_flow` (it is its first half), for lists that
    need to know which flows are published before they need any one of them.
    """
    judged = _judged(executor, policy, flow)
    return judged if isinstance(judged, FlowDecision) else None


# What _judged found for a flow it publishes: its plan's input model (None: the plan
# was compiled), the plan it compiled (None: the flow was shown clean without it), the
# effective safety, why policy would exclude it (when force_expose publishes it anyway)
# and the published contract.
_Published = tuple[Any, Plan | None, ToolSafetyContract | None, str | None,
                   PublishedContract]


def _judged(executor: FlowExecutor, policy: ExposurePolicy, flow: Flow
            ) -> FlowDecision | _Published:
    """Every check that decides whether ``flow`` is published: its decision when it is
    not, else what publishing it is built from."""
    name = flow.name
    if flow.governance.withheld is not None:
        # Shared governance withholds it (an entry this process cannot read, say):
        # before every policy setting, force_expose included.
        return _excluded(flow, flow.governance.withheld)
    if not flow.governance.publish:
        # The author's veto comes before every policy setting, force_expose included.
        return _excluded(flow, OPTED_OUT)
    if policy.flow_names is not None and name not in policy.flow_names:
        return _excluded(flow, "not listed in flow_names")
    # Most flows are shown clean without compiling their plan (the first list of a
    # large catalogue would compile every one); the others are compiled here, and
    # every problem and its words come from the compiler.
    input_model = executor.clean_input_model(flow)
    if input_model is None:
        problems = executor.check_flow(flow)
        if problems:
            # A flow that cannot run is never published, forced or not.
            return _excluded(flow, "flow is invalid: " + "; ".join(problems))
        plan: Plan | None = executor.plan(flow)
    else:
        plan = None
    safety = executor.effective_safety(flow)
    reason = _exclusion_reason(flow, executor, policy, safety)
    if reason is not None and not policy.force_expose:
        return _excluded(flow, reason)
    try:
        contract = build_contract(executor, flow, input_model)
    except ContractError as unpublishable:
        # Publishing it would break tools/list for every flow, so never, forced or not.
        return _excluded(flow, str(unpublishable))
    tool_name = policy.tool_name(name)
    if not NAME_PATTERN.fullmatch(tool_name):
        raise ExposureConfigError(
            f"published tool name {tool_name!r} for flow {name!r} is not a valid MCP tool "
            "name (1-64 of letters, digits, '_', '-', '.'); shorten the prefix or the flow name"
        )
    return input_model, plan, safety, reason, contract


def delegated_steps(plan: Plan | None) -> tuple[tuple[str, str], ...]:
    """Each step path a plan runs on a delegation, with the delegation's reason."""
    if plan is None or not plan.needs:
        return ()
    return tuple(dict.fromkeys((need.path, need.delegated) for need in plan.needs
                               if need.delegated is not None))


def task_mode(policy: ExposurePolicy, flow: Flow) -> str:
    """The flow's effective task mode: its own, else the server's; none without a backend."""
    if policy.task_mode is None:
        return "forbidden"
    return flow.task_mode or policy.task_mode


def _excluded(flow: Flow, reason: str) -> FlowDecision:
    logger.warning("flow %r v%s is not exposed: %s", flow.name, flow.version, reason)
    return FlowDecision(FlowExposure(flow.name, flow.version, False, reason), None)


def _exposed_flow(
    policy: ExposurePolicy,
    flow: Flow,
    safety: ToolSafetyContract | None,
    forced: bool,
    contract: PublishedContract,
    planned: PlanOnce,
    expose_schemas: bool,
    expose_prompts: bool,
    server_prompt_names: frozenset[str],
    clean_of: FlowExecutor | None,
) -> tuple[ExposedFlow, tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The exposed flow, its prompt names that server-level prompts take over, and the
    prompts the prompt policy withholds (with why). ``clean_of``: the executor that
    showed the flow clean without its plan (None: the plan was compiled)."""
    tool_name = policy.tool_name(flow.name)  # a valid tool name (checked by _judged)
    invocation = None
    authored: dict[str, FlowPrompt] = {}
    overridden: list[str] = []
    withheld: list[tuple[str, str]] = []
    if expose_prompts:
        by_name: dict[str, FlowPrompt | None] = {tool_name: None}
        by_name.update({f"{tool_name}__{p.name}": p for p in flow.prompts})
        for prompt_name, prompt in by_name.items():
            if prompt_name == GUIDE_PROMPT_NAME and prompt_name not in server_prompt_names:
                raise ExposureConfigError(
                    f"prompt name {prompt_name!r} of flow {flow.name!r} is reserved for the "
                    "guide prompt; rename the flow or set server_prefix"
                )
            if prompt_name in server_prompt_names:
                overridden.append(prompt_name)  # the operator's prompt takes this name
                continue
            why = policy.prompts.withheld("invocation" if prompt is None else "authored",
                                          flow.name)
            if why is not None:
                withheld.append((prompt_name, why))
                continue
            if prompt is None:
                invocation = prompt_name
            else:
                authored[prompt_name] = prompt
    uri = schema_uri(tool_name) if expose_schemas else None
    needs_approval = policy.approval == "elicit" and (
        approval_request(planned.get()) is not None if clean_of is None
        else clean_of.clean_needs_approval(flow))
    exposed = ExposedFlow(flow, tool_name, safety, forced, contract, planned, uri, authored,
                          invocation, needs_approval, task_mode(policy, flow))
    return exposed, tuple(overridden), tuple(withheld)
