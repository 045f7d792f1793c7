"""The MCP prompt components: invocation prompts, authored prompts, and the guide.

``prompts/get`` -> FastMCP -> ``FlowProvider._get_prompt`` (exposed names only) ->
``render`` here -> ``prompt_render`` builds the messages.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastmcp.exceptions import FastMCPError, PromptError
from fastmcp.prompts.base import Message, Prompt, PromptArgument, PromptResult

from chainweaver.mcp.components import prompt_render
from chainweaver.mcp.components.plain_slots import SET_BY_BUILD, PlainSlots
from chainweaver.mcp.publish.exposure import (
    GUIDE_PROMPT_NAME,
    ExposedFlow,
    Exposure,
)
from chainweaver.mcp.publish.live_exposure import LiveExposure
from chainweaver.prompts import FlowPrompt, PromptMessage

logger = logging.getLogger("chainweaver.mcp.components.prompts")


def _result(messages: list[PromptMessage], description: str | None,
            meta: dict[str, Any] | None = None) -> PromptResult:
    return PromptResult([Message(m.text, role=m.role) for m in messages],
                        description=description, meta=meta)


class FlowInvocationPrompt(PlainSlots, Prompt):
    """Schema-derived: one string argument per input property; renders a tool-call guide."""

    __slots__ = ("_exposed",)  # a plain attribute: a render reads it (plain_slots.py)
    if TYPE_CHECKING:
        _exposed: ExposedFlow = SET_BY_BUILD

    @classmethod
    def build(cls, exposed: ExposedFlow) -> FlowInvocationPrompt:
        assert exposed.invocation_prompt is not None
        prompt = cls(
            name=exposed.invocation_prompt,
            title=exposed.flow.display_title,
            description=exposed.flow.description,
            arguments=[PromptArgument(name=spec.name, description=spec.description or None,
                                      required=spec.required)
                       for spec in exposed.contract.arguments],
            meta={"chainweaver": {"flow": exposed.flow.name, "version": exposed.flow.version,
                                  "tool": exposed.tool_name}},
        )
        prompt._exposed = exposed
        return prompt

    async def render(self, arguments: dict[str, Any] | None = None) -> PromptResult:
        tool_arguments = prompt_render.tool_arguments(self.name, self._exposed.contract,
                                                      arguments)
        messages = prompt_render.invocation_messages(self._exposed, tool_arguments)
        meta = {"chainweaver": {"tool": self._exposed.tool_name, "arguments": tool_arguments}}
        return _result(messages, self.description, meta)


class AuthoredPrompt(PlainSlots, Prompt):
    """A ``FlowPrompt`` written by a flow author or a server operator."""

    __slots__ = ("_prompt",)
    if TYPE_CHECKING:
        _prompt: FlowPrompt = SET_BY_BUILD

    @classmethod
    def build(cls, published_name: str, prompt: FlowPrompt,
              exposed: ExposedFlow | None) -> AuthoredPrompt:
        meta = ({"chainweaver": {"flow": exposed.flow.name, "version": exposed.flow.version,
                                 "tool": exposed.tool_name}} if exposed else
                {"chainweaver": {"server_prompt": True}})
        component = cls(
            name=published_name,
            title=prompt.title,
            description=prompt.description or None,
            arguments=[PromptArgument(name=a.name, description=a.description or None,
                                      required=a.required) for a in prompt.arguments],
            meta=meta,
        )
        component._prompt = prompt
        return component

    async def render(self, arguments: dict[str, Any] | None = None) -> PromptResult:
        try:
            messages = prompt_render.authored_messages(self.name, self._prompt, arguments)
        except FastMCPError:
            raise
        except Exception as error:
            # A broken message factory is the author's bug: -32603, detail only in the log.
            logger.error("prompt %r failed to render: %s", self.name, type(error).__name__,
                         exc_info=error)
            raise PromptError(f"Prompt {self.name!r} could not be rendered") from None
        return _result(messages, self.description)


class GuidePrompt(PlainSlots, Prompt):
    """``chainweaver_guide``: the exposed flows, and when to choose which."""

    __slots__ = ("_flows",)
    if TYPE_CHECKING:
        _flows: Callable[[], list[ExposedFlow]] = SET_BY_BUILD

    @classmethod
    def build(cls, flows: Callable[[], list[ExposedFlow]]) -> GuidePrompt:
        """The guide to ``flows()`` (the exposed flows one caller's view holds)."""
        prompt = cls(
            name=GUIDE_PROMPT_NAME,
            title="Guide to the published flows",
            description="What each published flow does and when to choose it.",
            arguments=[],
        )
        prompt._flows = flows
        return prompt

    async def render(self, arguments: dict[str, Any] | None = None) -> PromptResult:
        prompt_render.check_argument_names(self.name, arguments, {})
        return _result(prompt_render.guide_messages(self._flows()), self.description)


def prompt_templates(exposure: Exposure | LiveExposure) -> list[dict[str, Any]]:
    """Every prompt ``exposure`` publishes, as a client would receive it with each
    argument set to the placeholder ``[name]`` (for operators: ``chainweaver inspect``).

    Placeholders are inserted without checking them against the flow's input schema:
    this shows the template, it does not validate a call. The guide lists every
    published flow (one caller's view may hold fewer).
    """
    templates = []
    for name, entry in sorted(exposure.prompts.items()):
        exposed = entry.exposed_flow
        if entry.prompt is not None:
            kind = "authored" if exposed is not None else "server"
            arguments = [(a.name, a.required, a.description) for a in entry.prompt.arguments]
            render: Callable[[], list[PromptMessage]] = functools.partial(
                prompt_render.authored_messages, name, entry.prompt,
                {a[0]: f"[{a[0]}]" for a in arguments})
        elif exposed is not None:
            kind = "invocation"
            arguments = [(s.name, s.required, s.description)
                         for s in exposed.contract.arguments]
            render = functools.partial(prompt_render.invocation_messages, exposed,
                                       {a[0]: f"[{a[0]}]" for a in arguments})
        else:
            kind, arguments = "guide", []
            render = functools.partial(prompt_render.guide_messages, exposure.exposed_flows)
        try:
            messages = [{"role": m.role, "text": m.text} for m in render()]
        except Exception as error:  # an author's message factory that fails
            messages = [{"role": "error", "text": f"cannot be rendered: "
                                                  f"{type(error).__name__}"}]
        templates.append({
            "name": name, "kind": kind, "flow": exposed.flow.name if exposed else None,
            "arguments": [{"name": n, "required": r, "description": d or ""}
                          for n, r, d in arguments],
            "messages": messages,
        })
    return templates
