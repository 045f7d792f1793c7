"""Testing flows: fake tools that record their calls, one-call runs, and assertions.

    from chainweaver.testing import FakeTool, run_flow

    carrier = FakeTool(track_parcel, TimeoutError, {"eta": "tomorrow"})  # fails once
    run = run_flow("flows/order_status.flow.yaml", {"order_id": "A-1001"},
                   tools=[find_order, carrier, summarise_order])
    run.assert_succeeded().assert_step("track_parcel", attempts=2)
    carrier.assert_called(2)

A fake keeps the name, schemas and safety contract of the tool it stands in for, so the
flow is planned, validated and run exactly as with the real one. With pytest, the
``flow_kit`` fixture (:class:`FlowKit`) collects tools, fakes and sub-flows for a test.
Needs nothing but the core package.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Union, cast

from pydantic import BaseModel

from .executor import FlowExecutor
from .files import load_flow_file
from .flows import Flow
from .registry import FlowRegistry
from .results import ExecutionResult, StepRecord, describe_error, step_table
from .run_events import ALWAYS_APPROVE, ApprovalHook
from .safety import ToolSafetyContract
from .tools import Tool

__all__ = ["FakeTool", "FlowKit", "FlowRun", "Outcome", "run_flow"]

# What a fake returns (a mapping or a model), raises (an exception, or its class), or
# computes from the input it received (a callable; it may raise too).
Outcome = Union[Mapping[str, Any], BaseModel, BaseException, type[BaseException],
                Callable[[dict[str, Any]], Any]]
FlowSource = Union[Flow, str, os.PathLike]


class FakeTool:
    """A stand-in for a tool: same name, schemas and safety; canned outcomes; every call
    recorded in :attr:`calls` (the input each call received, as a dict).

    Call N gets outcome N; once they run out, the last one repeats (one outcome: every
    call). With no outcome a call returns ``{}``. ``tool`` is the real :class:`Tool` to
    stand in for, or a name (then ``input_schema`` is required). Pass the fake, or its
    :attr:`tool`, wherever a tool goes.
    """

    def __init__(self, tool: Tool | str, *outcomes: Outcome,
                 input_schema: type[BaseModel] | None = None,
                 output_schema: type[BaseModel] | None = None,
                 safety: ToolSafetyContract | None = None) -> None:
        if isinstance(tool, Tool):
            input_schema = input_schema or tool.input_schema
            output_schema = output_schema or tool.output_schema
            safety = safety or tool.safety
            name, description = tool.name, tool.description
        elif input_schema is None:
            raise TypeError(f"FakeTool({tool!r}): give the real Tool, or input_schema=")
        else:
            name, description = tool, f"Fake {tool}"
        self.calls: list[dict[str, Any]] = []
        self._outcomes: list[Outcome] = list(outcomes) or [{}]
        self.tool = Tool(name, description, input_schema, output_schema, self._call, safety)

    @property
    def name(self) -> str:
        return self.tool.name

    @property
    def call_count(self) -> int:
        return len(self.calls)

    def _call(self, model: BaseModel) -> Any:
        inputs = model.model_dump()
        self.calls.append(inputs)
        outcome = self._outcomes[min(len(self.calls), len(self._outcomes)) - 1]
        if isinstance(outcome, type) and issubclass(outcome, BaseException):
            raise outcome(f"fake {self.name} raised {outcome.__name__}")
        if isinstance(outcome, BaseException):
            raise outcome
        result: Any = outcome
        if not isinstance(outcome, (Mapping, BaseModel)) and callable(outcome):
            result = cast("Callable[[dict[str, Any]], Any]", outcome)(dict(inputs))
        # A copy: a step that changes what it got must not change the next call's outcome.
        return dict(result) if isinstance(result, Mapping) else result

    def assert_called(self, times: int | None = None, *, last: Mapping[str, Any] | None = None
                      ) -> None:
        """That the fake was called (``times`` times), the last time with ``last``."""
        if times is None and not self.calls:
            raise AssertionError(f"fake {self.name} was never called")
        if times is not None and len(self.calls) != times:
            raise AssertionError(f"fake {self.name} was called {len(self.calls)} time(s), "
                                 f"expected {times}; calls: {self.calls}")
        if last is not None and (not self.calls or self.calls[-1] != dict(last)):
            got = self.calls[-1] if self.calls else "no call"
            raise AssertionError(f"fake {self.name}: last call got {got}, expected "
                                 f"{dict(last)}")

    def __repr__(self) -> str:
        return f"FakeTool({self.name!r}, calls={len(self.calls)})"


@dataclass(frozen=True)
class FlowRun:
    """One run's result, with assertions whose messages show the steps and the error.

    Every ``assert_*`` method raises :class:`AssertionError` with what was expected and
    what happened; those about the whole run return the run, so they chain.
    """

    result: ExecutionResult
    fakes: Mapping[str, FakeTool]

    @property
    def success(self) -> bool:
        return self.result.success

    @property
    def output(self) -> dict[str, Any] | None:
        """The flow's output (``final_output``); None when the run failed."""
        return self.result.final_output

    def step(self, step_id: str) -> StepRecord:
        """The record of step ``step_id``; ``outer/inner`` for a sub-flow's step."""
        records = self.result.steps
        record = None
        for part in step_id.split("/"):
            record = next((r for r in records if r.step_id == part), None)
            if record is None:
                known = ", ".join(r.step_id for r in records) or "none"
                raise AssertionError(f"no step {step_id!r} in the run of "
                                     f"{self.result.flow_name} (steps that ran: {known})\n"
                                     f"{self._story()}")
            records = record.steps or []
        assert record is not None  # noqa: S101 - split() gives at least one part
        return record

    def assert_succeeded(self) -> FlowRun:
        if not self.result.success:
            raise AssertionError(f"flow {self.result.flow_name} failed: "
                                 f"{describe_error(self.result.error)}\n{self._story()}")
        return self

    def assert_failed(self, error_type: str | None = None, *, step: str | None = None,
                      field: str | None = None) -> FlowRun:
        """That the run failed (with this error type, at this step id, on this field)."""
        error = self.result.error
        if self.result.success or error is None:
            raise AssertionError(f"flow {self.result.flow_name} succeeded, expected it to "
                                 f"fail; output: {self.result.final_output}\n{self._story()}")
        for what, expected, actual in (("error type", error_type, error.type),
                                       ("step", step, error.step_id),
                                       ("field", field, error.field)):
            if expected is not None and expected != actual:
                raise AssertionError(f"flow {self.result.flow_name} failed with {what} "
                                     f"{actual!r}, expected {expected!r}: "
                                     f"{describe_error(error)}\n{self._story()}")
        return self

    def assert_output(self, expected: Mapping[str, Any]) -> FlowRun:
        """That the run succeeded with exactly this output."""
        self.assert_succeeded()
        output = self.result.final_output or {}
        if output != dict(expected):
            raise AssertionError(f"flow {self.result.flow_name} output differs: "
                                 f"{_difference(output, expected)}\noutput: {output}")
        return self

    def assert_step(self, step_id: str, *, status: str | None = None,
                    attempts: int | None = None, outputs: Mapping[str, Any] | None = None,
                    inputs: Mapping[str, Any] | None = None, error_type: str | None = None
                    ) -> StepRecord:
        """That step ``step_id`` ran as given (each argument left out is not checked);
        returns its record."""
        record = self.step(step_id)
        error = record.error.type if record.error else None
        for what, expected, actual in (("status", status, record.status),
                                       ("attempts", attempts, record.attempts),
                                       ("error type", error_type, error)):
            if expected is not None and expected != actual:
                raise AssertionError(f"step {step_id!r}: {what} is {actual!r}, expected "
                                     f"{expected!r}\n{self._story()}")
        for what, expected_map, actual_map in (("inputs", inputs, record.inputs),
                                               ("outputs", outputs, record.outputs)):
            if expected_map is not None and dict(expected_map) != actual_map:
                raise AssertionError(f"step {step_id!r}: {what} differ: "
                                     f"{_difference(actual_map or {}, expected_map)}\n"
                                     f"{what}: {actual_map}")
        return record

    def _story(self) -> str:
        """The steps as ``chainweaver run`` shows them."""
        return step_table(self.result)


def _difference(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    """What differs between two mappings, key by key."""
    parts = [f"missing {key!r} (expected {expected[key]!r})"
             for key in expected if key not in actual]
    parts += [f"unexpected {key!r}={actual[key]!r}" for key in actual if key not in expected]
    parts += [f"{key!r} is {actual[key]!r}, expected {expected[key]!r}"
              for key in expected if key in actual and actual[key] != expected[key]]
    return "; ".join(parts) or "no difference by key"


def _flow(source: FlowSource) -> Flow:
    return source if isinstance(source, Flow) else load_flow_file(Path(source))


def run_flow(flow: FlowSource, input: Mapping[str, Any] | BaseModel | None = None, *,
             tools: Iterable[Tool | FakeTool] = (), flows: Iterable[FlowSource] = (),
             approve: ApprovalHook = ALWAYS_APPROVE, check: bool = True) -> FlowRun:
    """Run ``flow`` (a :class:`Flow`, or a flow file's path) once on ``input``.

    ``tools`` are the tools its steps use (real ones and fakes); ``flows`` the flows its
    sub-flow steps run. Steps that need approval are approved unless ``approve`` says
    otherwise. With ``check`` (the default) a flow that the static checks find invalid
    raises :class:`~chainweaver.FlowValidationError` before anything runs, as a server
    would refuse to publish it; ``check=False`` runs it anyway.
    """
    executor = FlowExecutor(FlowRegistry())
    fakes: dict[str, FakeTool] = {}
    for item in tools:
        if isinstance(item, FakeTool):
            fakes[item.name] = item
        executor.register_tool(item.tool if isinstance(item, FakeTool) else item)
    for sub in flows:
        executor.registry.register_flow(_flow(sub))
    main = _flow(flow)  # run as given: it need not be registered
    if check:
        executor.validate_flow(main)
    result = executor.execute_flow(main.name, input if input is not None else {},
                                   plan=executor.plan(main), approve=approve)
    return FlowRun(result, fakes)


class FlowKit:
    """Tools, fakes and sub-flows for one test (the ``flow_kit`` pytest fixture).

    ``use()`` adds real tools (or every public tool of a module) and sub-flows;
    ``fake()`` adds a fake, which replaces any real tool of its name; ``run()`` runs a
    flow against all of them.
    """

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._fakes: dict[str, FakeTool] = {}
        self._flows: list[FlowSource] = []

    def use(self, *items: Tool | ModuleType | FlowSource) -> FlowKit:
        for item in items:
            if isinstance(item, Tool):
                self._tools[item.name] = item
            elif isinstance(item, ModuleType):
                self._tools.update({value.name: value for key, value in vars(item).items()
                                    if isinstance(value, Tool) and not key.startswith("_")})
            else:
                self._flows.append(item)
        return self

    def fake(self, tool: Tool | str, *outcomes: Outcome, **schemas: Any) -> FakeTool:
        """A :class:`FakeTool` (same arguments), used by every later :meth:`run`."""
        fake = FakeTool(tool, *outcomes, **schemas)
        self._fakes[fake.name] = fake
        return fake

    def run(self, flow: FlowSource, input: Mapping[str, Any] | BaseModel | None = None,
            **options: Any) -> FlowRun:
        """:func:`run_flow` with this kit's tools, fakes and flows."""
        tools: dict[str, Tool | FakeTool] = {**self._tools, **self._fakes}
        return run_flow(flow, input, tools=tools.values(), flows=self._flows, **options)

