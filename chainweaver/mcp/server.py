"""FlowServer: publish the flows governance allows, as MCP tools, resources and prompts."""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import anyio
from fastmcp import FastMCP

from ..errors import ExposureConfigError
from ..executor import FlowExecutor
from ..flows import FlowLifecycle
from ..prompts import FlowPrompt
from ..safety import SideEffectLevel
from .exposure import INDEX_URI, Exposure, ExposurePolicy, FlowExposure, decide_exposure
from .flow_tool import ERROR_DETAILS, ErrorDetail
from .prompts import NonStringPromptArguments
from .provider import FlowProvider
from .security import AuditHook, Authenticator, Authorizer, RateLimiter, SecurityGate

logger = logging.getLogger("chainweaver.mcp")

Transport = Literal["stdio", "streamable-http"]


class FlowServer:
    """An MCP server publishing a :class:`FlowExecutor`'s flows under one governance filter.

    Every decision about what is published is made once, at construction
    (:meth:`exposure_report` shows it); a flow it excludes is absent from every
    primitive. Bad configuration raises :class:`ExposureConfigError` here, not later.
    """

    def __init__(
        self,
        executor: FlowExecutor,
        *,
        name: str = "chainweaver",
        flow_names: Iterable[str] | None = None,
        server_prefix: str = "",
        force_expose: bool = False,
        allowed_lifecycles: Iterable[FlowLifecycle | str] | None = None,
        allowed_side_effects: Iterable[SideEffectLevel | str] | None = None,
        owners: Iterable[str] | None = None,
        allow_requires_approval: bool = False,
        expose_schemas: bool = False,
        expose_prompts: bool = False,
        prompts: Sequence[FlowPrompt] = (),
        authenticator: Authenticator | None = None,
        rate_limiter: RateLimiter | None = None,
        authorizer: Authorizer | None = None,
        audit_hook: AuditHook | None = None,
        error_detail: ErrorDetail = "full",
        flow_timeout: float | None = None,
        hook_timeout: float = 5.0,
        instructions: str | None = None,
        page_size: int | None = None,
    ) -> None:
        if error_detail not in ERROR_DETAILS:
            raise ExposureConfigError(
                f"error_detail must be one of {', '.join(ERROR_DETAILS)}, got {error_detail!r}"
            )
        if flow_timeout is not None and not _positive_seconds(flow_timeout):
            raise ExposureConfigError(
                f"flow_timeout must be None or a number of seconds > 0, got {flow_timeout!r}")
        if not _positive_seconds(hook_timeout):
            raise ExposureConfigError(
                f"hook_timeout must be a number of seconds > 0, got {hook_timeout!r}")
        if not all(isinstance(p, FlowPrompt) for p in prompts):
            raise ExposureConfigError("prompts must be FlowPrompt values")
        if prompts and not expose_prompts:
            raise ExposureConfigError("server-level prompts need expose_prompts=True")
        self.executor = executor
        policy = ExposurePolicy.build(
            flow_names=flow_names,
            server_prefix=server_prefix,
            force_expose=force_expose,
            allowed_lifecycles=allowed_lifecycles,
            allowed_side_effects=allowed_side_effects,
            owners=owners,
            allow_requires_approval=allow_requires_approval,
            expose_schemas=expose_schemas,
            expose_prompts=expose_prompts,
        )
        self._exposure: Exposure = decide_exposure(executor, policy, prompts)
        self._provider = FlowProvider(self._exposure, executor, error_detail=error_detail,
                                      flow_timeout=flow_timeout)
        self._gate = SecurityGate(
            self._exposure,
            authenticator=authenticator,
            rate_limiter=rate_limiter,
            authorizer=authorizer,
            audit_hook=audit_hook,
            hook_timeout=hook_timeout,
        )
        # Schemas are published already dereferenced (see flow_tool.published_schema),
        # so FastMCP's per-list dereferencing pass would only cost time.
        self._fastmcp = FastMCP(
            name,
            instructions=instructions,
            providers=[self._provider],
            middleware=[self._gate],
            dereference_schemas=False,
            # A backstop: an exception that escapes a component must not carry its
            # message past the error_detail the operator chose.
            mask_error_details=error_detail != "full",
            list_page_size=page_size,
        )
        if expose_schemas or expose_prompts:
            self._fastmcp.add_completion_handler(self._provider.complete)
        if expose_prompts:
            # Outermost, so FastMCP and its security gate see the request it rewrites.
            self._fastmcp._mcp_server.middleware.insert(0, NonStringPromptArguments(self._exposure))

    @property
    def fastmcp(self) -> FastMCP:
        """The FastMCP instance, for adding more components or mounting."""
        return self._fastmcp

    @property
    def registered_tool_names(self) -> list[str]:
        """Published tool names of the exposed flows, sorted."""
        return sorted(self._exposure.tools)

    @property
    def resource_uris(self) -> list[str]:
        """Published schema resource URIs (plus the index), empty without expose_schemas."""
        if not self._exposure.policy.expose_schemas:
            return []
        return [INDEX_URI, *sorted(self._exposure.resources)]

    @property
    def prompt_names(self) -> list[str]:
        """Published prompt names, sorted; empty without expose_prompts."""
        return sorted(self._exposure.prompts)

    def exposure_report(self) -> list[FlowExposure]:
        """One entry per registered flow name: exposed or not, and why."""
        return list(self._exposure.report)

    def serve(
        self,
        transport: Transport = "stdio",
        host: str = "127.0.0.1",
        port: int = 8000,
        **options: Any,
    ) -> None:
        """Serve until interrupted. See :meth:`serve_async`."""
        anyio.run(lambda: self.serve_async(transport, host, port, **options))

    async def serve_async(
        self,
        transport: Transport = "stdio",
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        path: str = "/mcp",
        stateless: bool = False,
        log_level: str | None = None,
    ) -> None:
        """Serve over stdio (stdout carries only MCP) or streamable HTTP on ``path``.

        ``stateless=True`` keeps no per-session state on HTTP, so several server
        processes can sit behind one load balancer.
        """
        if transport == "stdio":
            try:
                await self._fastmcp.run_async("stdio", show_banner=False, log_level=log_level)
            finally:
                _flush_stray_stdout()
        elif transport == "streamable-http":
            await self._fastmcp.run_async(
                "streamable-http", show_banner=False, host=host, port=port, path=path,
                stateless_http=stateless, log_level=log_level,
            )
        else:
            raise ExposureConfigError(
                f"transport must be 'stdio' or 'streamable-http', got {transport!r}"
            )


def _positive_seconds(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _flush_stray_stdout() -> None:
    """Send text still buffered in ``sys.stdout`` (a tool's ``print``) to stderr.

    While it serves, mcp's stdio transport points fd 1 at stderr, so printed text
    cannot reach the client; when it stops it points fd 1 back at the MCP channel,
    where anything the buffer still held would land at interpreter exit.
    """
    stream = sys.stdout
    try:
        if stream is None or stream.fileno() != 1:
            return
        channel = os.dup(1)
    except (OSError, ValueError):
        return
    try:
        os.dup2(2, 1)
        stream.flush()
    except (OSError, ValueError):
        pass
    finally:
        os.dup2(channel, 1)
        os.close(channel)
