"""The MCP prompt components: invocation prompts, authored prompts, and the guide.

``prompts/get`` -> FastMCP -> ``FlowProvider._get_prompt`` (exposed names only) ->
``render`` here -> ``prompt_render`` builds the messages.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from fastmcp.exceptions import FastMCPError, PromptError
from fastmcp.prompts.base import Message, Prompt, PromptArgument, PromptResult
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from pydantic import PrivateAttr

from ..executor import FlowExecutor
from ..prompts import FlowPrompt, PromptMessage
from . import prompt_render
from .exposure import GUIDE_PROMPT_NAME, ExposedFlow, Exposure
from .flow_tool import flow_schemas

logger = logging.getLogger("chainweaver.mcp.prompts")


def _result(messages: list[PromptMessage], description: str | None,
            meta: dict[str, Any] | None = None) -> PromptResult:
    return PromptResult([Message(m.text, role=m.role) for m in messages],
                        description=description, meta=meta)


class FlowInvocationPrompt(Prompt):
    """Schema-derived: one string argument per input property; renders a tool-call guide."""

    _executor: FlowExecutor = PrivateAttr()
    _exposed: ExposedFlow = PrivateAttr()

    @classmethod
    def build(cls, exposed: ExposedFlow, executor: FlowExecutor) -> FlowInvocationPrompt:
        input_schema, _ = flow_schemas(executor, exposed)
        assert exposed.invocation_prompt is not None
        prompt = cls(
            name=exposed.invocation_prompt,
            title=exposed.flow.display_title,
            description=exposed.flow.description,
            arguments=[PromptArgument(name=name, description=about or None, required=required)
                       for name, about, required in prompt_render.argument_specs(input_schema)],
            meta={"chainweaver": {"flow": exposed.flow.name, "version": exposed.flow.version,
                                  "tool": exposed.tool_name}},
        )
        prompt._executor = executor
        prompt._exposed = exposed
        return prompt

    async def render(self, arguments: dict[str, Any] | None = None) -> PromptResult:
        input_schema, output_schema = flow_schemas(self._executor, self._exposed)
        tool_arguments = prompt_render.tool_arguments(self.name, input_schema, arguments)
        messages = prompt_render.invocation_messages(self._exposed, output_schema,
                                                     tool_arguments)
        meta = {"chainweaver": {"tool": self._exposed.tool_name, "arguments": tool_arguments}}
        return _result(messages, self.description, meta)


class AuthoredPrompt(Prompt):
    """A ``FlowPrompt`` written by a flow author or a server operator."""

    _prompt: FlowPrompt = PrivateAttr()

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


class GuidePrompt(Prompt):
    """``chainweaver_guide``: the exposed flows, and when to choose which."""

    _exposure: Exposure = PrivateAttr()

    @classmethod
    def build(cls, exposure: Exposure) -> GuidePrompt:
        prompt = cls(
            name=GUIDE_PROMPT_NAME,
            title="Guide to the published flows",
            description="What each published flow does and when to choose it.",
            arguments=[],
        )
        prompt._exposure = exposure
        return prompt

    async def render(self, arguments: dict[str, Any] | None = None) -> PromptResult:
        prompt_render.check_argument_names(self.name, arguments, {})
        return _result(prompt_render.guide_messages(self._exposure), self.description)


class NonStringPromptArguments:
    """MCP SDK middleware for ``prompts/get`` requests carrying non-string argument values.

    The SDK checks ``arguments`` against ``dict[str, str]`` before any FastMCP code
    runs and answers a bare "Invalid request parameters". Here such values are
    replaced by empty strings and remembered, so the request goes through the security
    gate like any other and rendering answers -32602 naming the prompt and argument
    (an unknown prompt name still answers "unknown prompt"). Only prompts this server
    publishes are touched: other prompts added to the FastMCP instance keep the SDK's
    own answer rather than rendering with blanked values.
    """

    def __init__(self, exposure: Exposure) -> None:
        self._exposure = exposure

    async def __call__(self, ctx: ServerRequestContext[Any, Any],
                       call_next: CallNext) -> HandlerResult:
        params = ctx.params
        arguments = params.get("arguments") if isinstance(params, Mapping) else None
        if (ctx.method != "prompts/get" or not isinstance(arguments, Mapping)
                or params.get("name") not in self._exposure.prompts):
            return await call_next(ctx)
        wrong = {str(name): _json_type(value) for name, value in arguments.items()
                 if not isinstance(value, str)}
        if not wrong:
            return await call_next(ctx)
        blanked = {name: value if isinstance(value, str) else ""
                   for name, value in arguments.items()}
        token = prompt_render.NON_STRING_ARGUMENTS.set(wrong)
        try:
            return await call_next(dataclasses.replace(
                ctx, params={**params, "arguments": blanked}))
        finally:
            prompt_render.NON_STRING_ARGUMENTS.reset(token)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array"}.get(type(value), type(value).__name__)
