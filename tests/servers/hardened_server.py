"""A FlowServer with the whole gate and some deliberately broken parts, for subprocess tests.

Serves the shared catalogue (``tests/catalogue.py``) over streamable HTTP on 127.0.0.1 with
``expose_schemas=True`` and ``expose_prompts=True``. Options:

``--token CALLER=TOKEN`` (repeatable)
    require ``Authorization: Bearer TOKEN``; the caller is CALLER.
``--rate-limit N [--rate-window S]``
    at most N gated requests per caller per window (``FixedWindowRateLimiter``).
``--forbid CALLER`` (repeatable)
    the authorizer refuses these callers (reason ``forbidden``).
``--audit FILE``
    append every audit event as one JSON line.
``--breakable``
    a request with header ``X-Break: HOOK:slow`` or ``X-Break: HOOK:fail`` (HOOK is
    audit, authenticator or authorizer) makes that hook sleep far past
    ``--hook-timeout`` or raise an error quoting ``SECRET``, for that request only.
``--faulty``
    add flows that fail: ``faulty_raises``, ``faulty_hangs`` (past ``--flow-timeout``)
    and ``faulty_malformed`` (its tool returns output that does not fit its model).
``--stateless``
    stateless streamable HTTP, as for several processes behind one load balancer.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The catalogue lives next to the tests, not in an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastmcp.server.dependencies import get_http_headers  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from support.catalogue import build_catalogue  # noqa: E402

from chainweaver import (  # noqa: E402
    Flow,
    FlowExecutor,
    FlowStep,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import (  # noqa: E402
    AuditEvent,
    AuthorizationDecision,
    CallerIdentity,
    FixedWindowRateLimiter,
    FlowServer,
    GateContext,
    SecurityConfig,
    ServingConfig,
)

# Text that must never reach a client: hooks and faulty tools put it in their errors.
SECRET = "s3cr3t-hunter2-do-not-leak"
READ = ToolSafetyContract(SideEffectLevel.READ)


class Count(BaseModel):
    count: int


@tool(safety=READ)
def raise_error(query: str) -> dict:
    """Fail with an error whose message holds a secret."""
    raise RuntimeError(f"backend credentials {SECRET} rejected")


@tool(safety=READ)
async def hang(query: str) -> dict:
    """Never finish in time: only ``flow_timeout`` ends the call."""
    await asyncio.sleep(3600)
    return {"query": query}


@tool(safety=READ)
def malformed(query: str) -> Count:
    """Return output that does not fit the declared ``Count`` model."""
    return {"count": "many", "leak": SECRET}  # type: ignore[return-value]


def add_faulty_flows(executor: FlowExecutor) -> None:
    for fn in (raise_error, hang, malformed):
        executor.register_tool(fn)
    for name, step in (("faulty_raises", "raise_error"), ("faulty_hangs", "hang"),
                       ("faulty_malformed", "malformed")):
        executor.registry.register_flow(Flow(name, f"A flow that fails ({step}).",
                                             [FlowStep(step)]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--token", action="append", default=[], metavar="CALLER=TOKEN")
    parser.add_argument("--rate-limit", type=int)
    parser.add_argument("--rate-window", type=float, default=3600.0)
    parser.add_argument("--forbid", action="append", default=[], metavar="CALLER")
    parser.add_argument("--audit")
    parser.add_argument("--breakable", action="store_true")
    parser.add_argument("--hook-timeout", type=float, default=0.5)
    parser.add_argument("--faulty", action="store_true")
    parser.add_argument("--flow-timeout", type=float, default=None)
    parser.add_argument("--error-detail", default="full",
                        choices=["full", "type_only", "generic"])
    return parser.parse_args(argv)


def build_server(args: argparse.Namespace) -> FlowServer:
    executor = build_catalogue()
    if args.faulty:
        add_faulty_flows(executor)
    tokens = {token: caller for caller, token in (item.split("=", 1) for item in args.token)}
    audit_lock = threading.Lock()

    async def misbehave(hook: str, headers: Mapping[str, str]) -> None:
        # Slow hooks sleep far past hook_timeout; failing ones raise with the secret.
        if not args.breakable:
            return
        wanted = headers.get("x-break", "")
        if wanted == f"{hook}:slow":
            await asyncio.sleep(3600)
        if wanted == f"{hook}:fail":
            raise RuntimeError(f"{hook} backend said {SECRET}")

    async def authenticate(ctx: GateContext) -> CallerIdentity | None:
        await misbehave("authenticator", ctx.headers)
        # Header names arrive lower-cased over HTTP; the scheme must be exactly "Bearer".
        scheme, _, presented = ctx.headers.get("authorization", "").partition(" ")
        caller = tokens.get(presented) if scheme == "Bearer" else None
        return CallerIdentity(caller) if caller else None

    async def authorize(ctx: GateContext) -> bool | AuthorizationDecision:
        await misbehave("authorizer", ctx.headers)
        assert ctx.caller is not None
        if ctx.caller.id in args.forbid:
            return AuthorizationDecision(False, "forbidden")
        return True

    async def audit(event: AuditEvent) -> None:
        # Audit events carry no headers; the hook runs inside the request, so ask FastMCP.
        await misbehave("audit", get_http_headers(include_all=True))
        line = json.dumps(dataclasses.asdict(event)) + "\n"
        with audit_lock, open(args.audit, "a", encoding="utf-8") as sink:
            sink.write(line)

    options: dict[str, Any] = {}
    if tokens:
        options["authenticator"] = authenticate
    if args.rate_limit:
        options["rate_limiter"] = FixedWindowRateLimiter(args.rate_limit, args.rate_window)
    if args.forbid or args.breakable:
        options["authorizer"] = authorize
    if args.audit:
        options["audit_hook"] = audit
    return FlowServer(
        executor,
        expose_schemas=True,
        expose_prompts=True,
        security=SecurityConfig(hook_timeout=args.hook_timeout, error_detail=args.error_detail,
                                **options),
        serving=ServingConfig(flow_timeout=args.flow_timeout, name="hardened"),
    )


def main() -> None:
    args = parse_args()
    server = build_server(args)
    server.serve("streamable-http", host="127.0.0.1", port=args.port,
                 stateless=args.stateless)


if __name__ == "__main__":
    main()
