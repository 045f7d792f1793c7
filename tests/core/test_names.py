"""Names match as a whole string: no trailing newline or other whitespace slips through.

Python's ``$`` also matches before a final newline, so ``re.match(r"^x$", "x\\n")``
succeeds; every name check must reject that, for flows, tools, prompts, prompt
arguments and server prefixes alike.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from chainweaver import (
    ExposureConfigError,
    Flow,
    FlowPrompt,
    FlowStep,
    InvalidNameError,
    PromptArgument,
    PromptDefinitionError,
    PromptMessage,
    Tool,
)

SUFFIXES = ["\n", "\r\n", " ", "\t", "\x0b", "\x0c", "\u00a0", "\u2028", "\x00"]


class In(BaseModel):
    x: int


def build(kind: str, name: str) -> Any:
    if kind == "flow":
        return Flow(name, "A flow.", [FlowStep("tool")])
    if kind == "tool":
        return Tool(name, "A tool.", In, None, lambda data: {})
    if kind == "step":
        return FlowStep(name)
    if kind == "prompt":
        return FlowPrompt(name, messages=[PromptMessage("user", "Hi.")])
    if kind == "argument":
        return PromptArgument(name)
    from chainweaver.mcp import ExposurePolicy  # needs the mcp extra
    return ExposurePolicy(server_prefix=name)


ERRORS = {"flow": InvalidNameError, "tool": InvalidNameError, "step": InvalidNameError,
          "prompt": PromptDefinitionError, "argument": PromptDefinitionError,
          "prefix": ExposureConfigError}


@pytest.mark.parametrize("kind", sorted(ERRORS))
@settings(deadline=None)  # the first example imports chainweaver.mcp
@given(suffix=st.sampled_from(SUFFIXES), prefix_too=st.booleans())
def test_whitespace_around_a_valid_name_is_rejected(kind: str, suffix: str,
                                                    prefix_too: bool) -> None:
    build(kind, "valid_name")  # the name itself is fine
    name = (suffix if prefix_too else "") + "valid_name" + suffix
    with pytest.raises(ERRORS[kind]):
        build(kind, name)
