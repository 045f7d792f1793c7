"""FlowExecutor: compiles flows into plans and runs them, validating every step.

A run never raises for bad data: invalid input, a tool that raises or returns the
wrong shape, or a missing context key ends the run with ``success=False`` and an
error naming the step, the tool and the field; the steps before it stay recorded.
Only programming errors about *which* flow to run (unknown name or version) raise.

A flow with a step that needs approval runs only when its caller says how it is
approved: ``approve=`` a hook asked once before any step (the MCP server asks the
client's user), or ``approve=ALWAYS_APPROVE`` to run it without asking. Without either
the run fails with ``ApprovalRequired`` and no step runs; a sub-flow runs under the
decision of the run that started it.

Both lanes (:mod:`chainweaver.engine.lanes`) run the same step runner
(:mod:`chainweaver.engine.runner`):
``execute_flow`` runs the steps one at a time in plan order; ``execute_flow_async`` runs
every ready step at once (up to ``max_concurrent_steps``), awaiting async tools and running
sync tools in worker threads. Results (failures included) never depend on timing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from .checkpoints import CheckpointStore
from .engine.lanes import Lanes
from .errors import DuplicateToolError, FlowValidationError, ToolNotFoundError
from .flows import Flow
from .grants import StepAuthorizer
from .mapping_checks import clean_input_model, clean_needs_approval
from .plan import MAX_SUBFLOW_DEPTH, Plan, Problem, Resolver, compile_plan
from .registry import FlowRegistry
from .results import ErrorInfo, ExecutionResult, StepRecord
from .run_events import ALWAYS_APPROVE, ApprovalHook, Cancellation, RunObserver
from .safety import ToolSafetyContract, merge_safety_contracts
from .step_guard import StepGuard, fixed_caller
from .tools import Tool

__all__ = ["ALWAYS_APPROVE", "ErrorInfo", "ExecutionResult", "FlowExecutor", "StepRecord"]


class FlowExecutor:
    """Runs registered flows with the tools registered on it."""

    def __init__(self, registry: FlowRegistry, *, max_threads: int = 32,
                 max_concurrent_steps: int = 16,
                 step_authorizer: StepAuthorizer | None = None) -> None:
        if max_concurrent_steps < 1:
            raise ValueError("max_concurrent_steps must be at least 1")
        if step_authorizer is not None and not callable(step_authorizer):
            raise TypeError("step_authorizer must be a callable (StepRequest) -> bool")
        self.registry = registry
        # Asked before every attempt of every step of a run with a caller (grants.py).
        self.step_authorizer = step_authorizer
        self._tools: dict[str, Tool] = {}
        # (name, version) -> (plan, problems); compiled once per flow version.
        self._plans: dict[tuple[str, str], tuple[Plan, list[Problem]]] = {}
        self._lanes = Lanes(max_threads, max_concurrent_steps)
        self.plans_compiled = 0  # how many times a plan was compiled (benchmarks read it)

    # ------------------------------------------------------------------ tools

    def register_tool(self, tool: Tool) -> Tool:
        """Make ``tool`` available to flow steps; a second tool with its name is an error."""
        if not isinstance(tool, Tool):
            raise TypeError(f"register_tool expects a Tool, got {type(tool).__name__}")
        if tool.name in self._tools:
            raise DuplicateToolError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._plans.clear()
        return tool

    def get_tool(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise ToolNotFoundError(f"no tool named {name!r} is registered") from None

    @property
    def tools(self) -> Mapping[str, Tool]:
        return dict(self._tools)

    # ---------------------------------------------------- schemas and safety

    def _subflow(self, name: str) -> Flow | None:
        """The version a sub-flow step runs: the latest active one (None: there is none)."""
        return self.registry.latest_active(name)

    def _followed_subflow(self, name: str, parent: Flow, seen: tuple[str, ...]
                          ) -> Flow | None:
        """The sub-flow a step of ``parent`` runs, unless it is missing, recurses or nests
        deeper than ``MAX_SUBFLOW_DEPTH`` (None: then nothing about it can be known)."""
        sub = self._subflow(name)
        if sub is None or sub.name in seen or sub.name == parent.name \
                or len(seen) >= MAX_SUBFLOW_DEPTH:
            return None
        return sub

    def input_model(self, flow: Flow, _seen: tuple[str, ...] = ()) -> type[BaseModel] | None:
        """The flow's input model: its own, else its first step's (None when unknown)."""
        if flow.input_schema is not None:
            return flow.input_schema
        return self._step_model(flow, flow.order[0], "input", _seen)

    def output_model(self, flow: Flow, _seen: tuple[str, ...] = ()) -> type[BaseModel] | None:
        """The flow's output model: its own, else its single last step's (None when unknown)."""
        if flow.output_schema is not None:
            return flow.output_schema
        # A flow without output_schema has exactly one last step.
        return self._step_model(flow, flow.sink, "output", _seen)  # type: ignore[arg-type]

    def _step_model(self, flow: Flow, index: int, side: str, seen: tuple[str, ...]
                    ) -> type[BaseModel] | None:
        step = flow.steps[index]
        if step.flow is not None:
            sub = self._followed_subflow(step.flow, flow, seen)
            if sub is None:
                return None
            inner = (*seen, flow.name)
            return self.input_model(sub, inner) if side == "input" \
                else self.output_model(sub, inner)
        tool = self._tools.get(step.tool_name)  # type: ignore[arg-type]
        if tool is None:
            return None
        return tool.input_schema if side == "input" else tool.output_schema

    def effective_safety(self, flow: Flow, _seen: tuple[str, ...] = (), *,
                         declared: bool = True) -> ToolSafetyContract | None:
        """The flow's own contract, else the merge over every step, fallback and sub-flow.

        None (unknown) when any of them is missing, declares no contract, recurses or
        nests too deeply. ``declared=False`` ignores every flow's own contract (at any
        depth): what the tools really do, which decides whether a sub-flow step may be
        retried.
        """
        return self._safety(flow, _seen, declared, {})

    def _safety(self, flow: Flow, seen: tuple[str, ...], declared: bool,
                memo: dict[str, ToolSafetyContract | None]) -> ToolSafetyContract | None:
        if declared and flow.safety is not None:
            return flow.safety
        contracts = []
        for step in flow.steps:
            if step.flow is not None:
                sub = self._followed_subflow(step.flow, flow, seen)
                if sub is None:
                    return None
                if sub.name not in memo:  # a sub-flow used many times is merged once
                    memo[sub.name] = self._safety(sub, (*seen, flow.name), declared, memo)
                contract = memo[sub.name]
            else:
                tool = self._tools.get(step.tool_name)  # type: ignore[arg-type]
                contract = tool.safety if tool else None
            if contract is None:
                return None
            contracts.append(contract)
            if step.fallback is not None:
                fallback = self._tools.get(step.fallback)
                if fallback is None or fallback.safety is None:
                    return None
                contracts.append(fallback.safety)
        return merge_safety_contracts(contracts)

    def _tools_safety(self, flow: Flow) -> ToolSafetyContract | None:
        return self.effective_safety(flow, declared=False)

    def _compile(self, flow: Flow) -> tuple[Plan, list[Problem]]:
        """Compile ``flow``; each sub-flow (at any depth) is compiled once per call, or
        taken from the cache when it compiled there without problems."""
        compiled: dict[tuple[str, str], tuple[Plan, list[Problem]]] = {}

        def check(sub: Flow, stack: tuple[str, ...]) -> tuple[Plan, list[Problem]]:
            key = (sub.name, sub.version)
            if key not in compiled:
                cached = self._cached(sub)
                if cached is None or cached[1]:
                    cached = compile_plan(sub, resolver, stack)
                    self.plans_compiled += 1
                    if not cached[1]:
                        self._plans[key] = cached
                compiled[key] = cached
            return compiled[key]

        resolver = Resolver(self._tools, self._subflow, self.input_model, self.output_model,
                            self._tools_safety, check, registered=self.registry.__contains__)
        self.plans_compiled += 1
        return compile_plan(flow, resolver)

    def flow_problems(self, flow: Flow) -> list[Problem]:
        """Every problem :meth:`check_flow` reports, as data (kind, message, step, field)."""
        return list(self._plan(flow)[1])

    def check_flow(self, flow: Flow) -> list[str]:
        """Why ``flow`` cannot run, or cannot succeed for any input (empty: none found).

        Missing tools and sub-flows, bad mappings, retries on non-idempotent steps,
        steps that may run at once writing the same key, and the data-flow check: a
        required field nothing can provide, a mapping to a key that can never exist, an
        output schema the context cannot fill. Undeclared tool outputs may provide
        anything.
        """
        return [problem.message for problem in self._plan(flow)[1]]

    def clean_input_model(self, flow: Flow) -> type[BaseModel] | None:
        """The input model of the flow's plan when the flow is shown to have no problem
        without compiling it (:func:`chainweaver.mapping_checks.clean_input_model`);
        None: compile to know."""
        return clean_input_model(flow, self._tools)

    def clean_needs_approval(self, flow: Flow) -> bool:
        """For a flow :meth:`clean_input_model` showed clean: whether a run of it asks
        for approval, read from its tools (its plan would say the same)."""
        return clean_needs_approval(flow, self._tools)

    def validate_flow(self, flow: Flow) -> None:
        """Raise :class:`FlowValidationError` if :meth:`check_flow` finds problems."""
        problems = self.check_flow(flow)
        if problems:
            raise FlowValidationError(flow.name, problems)

    def plan(self, flow: Flow) -> Plan:
        """The compiled plan of ``flow`` (cached per flow version)."""
        return self._plan(flow)[0]

    def _plan(self, flow: Flow) -> tuple[Plan, list[Problem]]:
        """(plan, every problem), compiled once per flow version: again only after a tool
        is registered or a sub-flow (at any depth) gets a new latest active version, or
        a missing one appears."""
        cached = self._cached(flow)
        if cached is None:
            cached = self._plans[(flow.name, flow.version)] = self._compile(flow)
        return cached

    def _cached(self, flow: Flow) -> tuple[Plan, list[Problem]] | None:
        cached = self._plans.get((flow.name, flow.version))
        if cached is not None and cached[0].flow is flow and (
                not cached[0].subflow_versions or all(
                    getattr(self._subflow(name), "version", None) == version
                    for name, version in cached[0].subflow_versions)):
            return cached
        return None

    # ------------------------------------------------------------- execution

    def execute_flow(
        self, name: str, input: Mapping[str, Any] | BaseModel, version: str | None = None,
        *, plan: Plan | None = None, observer: RunObserver | None = None,
        cancel: Cancellation | None = None, approve: ApprovalHook | None = None,
        run_id: str | None = None, caller: Any = None, guard: StepGuard | None = None,
    ) -> ExecutionResult:
        """Run a flow synchronously, one step at a time in plan order.

        Async tools run on a private event loop; a step with a ``timeout`` runs its tool
        in a helper thread that is abandoned (left to finish) when time runs out.
        ``plan`` (from :meth:`plan`) runs exactly that plan, with the sub-flows it was
        compiled with, whatever was registered since. ``observer`` is told about each
        step; ``cancel`` (set from another thread) stops the run before its next step.

        ``approve`` decides whether a flow with steps that need approval may run
        (:func:`~chainweaver.run_events.approval_request` says which steps one approval
        covers): a hook ``(ApprovalRequest) -> bool`` called once, after the input is
        validated and before any step starts (an async hook is awaited on a private
        loop), or :data:`ALWAYS_APPROVE` to run without asking. Left out, such a flow
        fails with ``ApprovalRequired`` before any step; a hook that returns anything
        but ``True`` (or raises) fails it with ``ApprovalDenied``. No step runs either way.

        ``run_id`` names the run for idempotency keys (a fresh id when left out).

        ``caller`` is who the run is for (anything with ``scopes``, a set or list of names
        or one space-separated string, and ``claims``, a mapping, such as
        :class:`~chainweaver.grants.Caller`, or a callable returning the caller as it is
        now). When the flow declares grants (at any depth) or the executor has a
        ``step_authorizer``, every attempt of every step (call, retry, fallback,
        sub-flow) is checked first; a refusal fails the run with ``StepRefused`` at that
        step, before it runs (``docs/step-grants.md``). No caller holds no grant.
        ``guard`` (a :class:`~chainweaver.step_guard.StepGuard`) replaces ``caller`` for
        servers that collect the decisions themselves.
        """
        to_run = self._plan_to_run(name, version, plan)
        # The checks of step_guard, _checked and _run_id, inlined: a run of a small flow
        # costs about as much as a few calls more.
        if guard is None and (to_run.needs or self.step_authorizer is not None):
            guard = self.step_guard(to_run, caller)
        if approve is not None:
            _checked(approve)
        if run_id is not None:
            _run_id(run_id)
        return self._lanes.run_sync(to_run, input, observer=observer, cancel=cancel,
                                    approve=approve, run_id=run_id, guard=guard)

    def step_guard(self, plan: Plan, caller: Any,
                   authorizer: StepAuthorizer | None = None) -> StepGuard | None:
        """The guard a run of ``plan`` for ``caller`` asks before every attempt; None
        when there is nothing to ask (no declared grant, no step authorizer)."""
        authorizer = authorizer or self.step_authorizer
        if not plan.needs and authorizer is None:
            return None
        source = caller if callable(caller) and not hasattr(caller, "scopes") \
            else fixed_caller(caller)
        return StepGuard(source, authorizer, plan.flow.name, plan.flow.version,
                         delegations=tuple(plan.flow.delegations))

    def _plan_to_run(self, name: str, version: str | None, plan: Plan | None) -> Plan:
        if plan is None:
            flow = self.registry.get_flow(name, version)
            cached = self._plans.get((flow.name, flow.version))
            if cached is not None and cached[0].flow is flow \
                    and not cached[0].subflow_versions:
                return cached[0]  # _cached's answer, without its calls
            return self._plan(flow)[0]
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a Plan from FlowExecutor.plan(), got "
                            f"{type(plan).__name__}")
        if plan.flow.name != name or version not in (None, plan.flow.version):
            raise ValueError(f"plan is of flow {plan.flow.name!r} {plan.flow.version}, not "
                             f"{name!r}{'' if version is None else ' ' + version}")
        return plan

    async def execute_flow_async(
        self,
        name: str,
        input: Mapping[str, Any] | BaseModel,
        version: str | None = None,
        *,
        timeout: float | None = None,
        plan: Plan | None = None,
        observer: RunObserver | None = None,
        cancel: Cancellation | None = None,
        approve: ApprovalHook | None = None,
        run_id: str | None = None,
        checkpoints: CheckpointStore | None = None,
        caller: Any = None,
        guard: StepGuard | None = None,
    ) -> ExecutionResult:
        """Run a flow without blocking the event loop, ready steps concurrently.

        ``timeout`` (seconds) bounds the whole run; a run that exceeds it fails with
        ``TimeoutError`` and keeps its finished steps. A failed run has the error and the
        records :meth:`execute_flow` gives (steps after the first failure in plan order
        neither start nor appear). After a timeout or a cancellation no further step,
        retry or fallback starts; a sync tool already running in a worker thread cannot
        be interrupted, so it finishes and its output is discarded. ``plan`` is as for
        :meth:`execute_flow`.

        ``observer`` is told about each step (:class:`~chainweaver.run_events.RunObserver`).
        ``cancel`` stops the run at the next step boundary (running async tools are
        cancelled at once); the result then fails with ``CancelledError``.

        ``approve`` is as for :meth:`execute_flow`: a hook called once, after the input
        is validated and before any step starts, when a step requires approval (an
        async hook is awaited; a sync one is called on the event loop, so it must not
        block), or :data:`ALWAYS_APPROVE`. Without it such a flow fails with
        ``ApprovalRequired``; unless the hook returns ``True`` the run fails with
        ``ApprovalDenied``. No step runs either way.

        ``run_id`` names the run: each step's :data:`~chainweaver.IdempotencyKey`
        derives from it (a fresh id when left out). With ``checkpoints`` (a
        :class:`~chainweaver.checkpoints.CheckpointStore`, which needs ``run_id``) the
        run is durable: each step's output is checkpointed before a step that depends
        on it starts, and a run started again with the same id resumes, running only
        the steps that had not completed (:mod:`chainweaver.checkpoints`). Checkpoints
        of another flow version, plan or input raise
        :class:`~chainweaver.checkpoints.CheckpointMismatchError`.

        ``caller`` and ``guard`` are as for :meth:`execute_flow`: every attempt of every
        step is checked against the caller as it is then (a resumed run included).
        """
        if checkpoints is not None and run_id is None:
            raise ValueError("checkpoints= needs run_id= (the id a resumed run is found by)")
        to_run = self._plan_to_run(name, version, plan)
        return await self._lanes.run_async(to_run, input,
                                           timeout, observer=observer, cancel=cancel,
                                           approve=_checked(approve), run_id=_run_id(run_id),
                                           checkpoints=checkpoints,
                                           guard=guard or self.step_guard(to_run, caller))


def _run_id(run_id: str | None) -> str | None:
    if run_id is not None and (not isinstance(run_id, str) or not run_id):
        raise TypeError(f"run_id must be a non-empty str, got {run_id!r}")
    return run_id


def _checked(approve: ApprovalHook | None) -> ApprovalHook | None:
    """``approve`` if it is a hook, ALWAYS_APPROVE or None (a wrong type is a bug)."""
    if approve is not None and not callable(approve):
        raise TypeError(f"approve must be a hook (ApprovalRequest) -> bool, ALWAYS_APPROVE "
                        f"or None, got {type(approve).__name__}")
    return approve
