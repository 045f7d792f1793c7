"""How a step fails: the exception that carries a failure's :class:`ErrorInfo` through
the step runner, and the failures of a step's input, call and output, worded once for
both lanes."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from ..plan import PlannedStep
from ..results import ErrorInfo
from ..tools import Tool

logger = logging.getLogger("chainweaver.executor")


class StepFailed(Exception):
    """Internal: carries the ErrorInfo of a failure (and the exception behind it)."""

    def __init__(self, info: ErrorInfo, cause: BaseException | None = None) -> None:
        super().__init__(info.message)
        self.info = info
        self.cause = cause


class StepTimeout(TimeoutError):
    """Raised into a step by its lane when one attempt ran out of time."""


class SubFlowFailed(Exception):
    """The cause of a failed sub-flow attempt: ``retry_on`` may name it or the error
    type its run ended with (``error_type``)."""

    def __init__(self, error_type: str) -> None:
        super().__init__(error_type)
        self.error_type = error_type


def first_error_field(error: ValidationError) -> str | None:
    errors = error.errors()
    if not errors or not errors[0].get("loc"):
        return None
    return ".".join(str(part) for part in errors[0]["loc"])


def describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item.get("loc", ())) or "(root)"
        parts.append(f"{where}: {item.get('msg')}")
    return "; ".join(parts)


def raised(what: str, error: BaseException, **where: Any) -> StepFailed:
    """A failure raised by code the executor calls (a tool, a validator, a serializer).

    The message may carry the exception's text; servers decide how much of it to show.
    """
    logger.debug("%s raised", what, exc_info=error)
    try:
        text = str(error)
    except Exception:  # an exception whose __str__ itself fails
        text = "(message unavailable)"
    name = type(error).__name__
    return StepFailed(ErrorInfo(name, f"{what} raised {name}: {text}", **where), error)


def where(planned: PlannedStep, tool_name: str | None = None, **extra: Any) -> dict:
    return {"step_index": planned.index, "tool_name": tool_name or planned.name,
            "step_id": planned.id, **extra}


def input_failed(planned: PlannedStep, tool: Tool, error: Exception) -> StepFailed:
    """The failure of a step whose input did not validate (or whose validator raised)."""
    if isinstance(error, ValidationError):
        return StepFailed(ErrorInfo(
            "StepInputError", f"{what(planned, tool)} input is invalid: {describe(error)}",
            **where(planned, tool.name), field=first_error_field(error)))
    return raised(f"{what(planned, tool)} input validation", error,
                  **where(planned, tool.name))


def call_failed(planned: PlannedStep, tool: Tool, error: BaseException) -> StepFailed:
    """A tool call that raised (its failure is data, not a crash) or timed out."""
    if isinstance(error, StepTimeout):
        return StepFailed(ErrorInfo(
            "TimeoutError", f"{what(planned, tool)} did not finish within "
            f"{planned.step.timeout} s", **where(planned, tool.name)), error)
    return raised(what(planned, tool), error, **where(planned, tool.name))


def what(planned: PlannedStep, tool: Tool) -> str:
    if tool is planned.tool:
        return planned.label
    return f"{planned.label} fallback {tool.name!r}"


def output_failed(planned: PlannedStep, tool: Tool, error: Exception) -> StepFailed:
    """The failure of a step whose output did not validate (or whose validator or
    serializer raised, e.g. on an unconvertible value)."""
    if isinstance(error, ValidationError):
        return StepFailed(ErrorInfo(
            "StepOutputError", f"{what(planned, tool)} output is invalid: {describe(error)}",
            **where(planned, tool.name), field=first_error_field(error)))
    return raised(f"{what(planned, tool)} output validation", error,
                  **where(planned, tool.name))
