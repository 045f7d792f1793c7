"""Serve the shared test catalogue over a real transport, for the subprocess tests.

Usage: ``python catalogue_server.py stdio|streamable-http [--port N] [--token T]
[--audit FILE] [--noisy] [--expose] [--tasks]``. ``--token`` requires ``Authorization: Bearer T``
and ``X-Caller`` names the caller; ``--audit`` appends every audit event as one JSON
line; ``--noisy`` adds a flow whose tool prints to stdout and logs, to prove neither
reaches the MCP channel; ``--expose`` turns on ``expose_schemas`` and ``expose_prompts``;
``--tasks`` serves background tasks in memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

# The catalogue lives next to the tests, not in an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.catalogue import build_catalogue  # noqa: E402

from chainweaver import Flow, FlowStep, SideEffectLevel, ToolSafetyContract, tool  # noqa: E402
from chainweaver.mcp import (  # noqa: E402
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    ServingConfig,
)


@tool(safety=ToolSafetyContract(SideEffectLevel.NONE))
def chatty_echo(text: str) -> dict:
    """Echo ``text`` after writing to stdout and logging, as careless tools do."""
    print(f"chatty_echo printing {text}")
    logging.getLogger("chatty").warning("chatty_echo logging %s", text)
    return {"echo": text}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "streamable-http"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token")
    parser.add_argument("--audit")
    parser.add_argument("--noisy", action="store_true")
    parser.add_argument("--expose", action="store_true")
    parser.add_argument("--tasks", action="store_true", help='tasks="memory://"')
    args = parser.parse_args()

    executor = build_catalogue()
    if args.noisy:
        logging.basicConfig(level=logging.INFO)  # a root handler, as applications often add
        executor.register_tool(chatty_echo)
        executor.registry.register_flow(Flow("chatty", "Echo noisily.", [FlowStep("chatty_echo")]))

    def authenticate(ctx: GateContext) -> CallerIdentity | None:
        # HTTP header names arrive lower-cased; X-Caller names the caller in the audit.
        if ctx.headers.get("authorization") != f"Bearer {args.token}":
            return None
        return CallerIdentity(ctx.headers.get("x-caller", "token-holder"))

    def audit(event: AuditEvent) -> None:
        with open(args.audit, "a", encoding="utf-8") as sink:
            sink.write(json.dumps(dataclasses.asdict(event)) + "\n")

    server = FlowServer(
        executor,
        expose_schemas=args.expose,
        expose_prompts=args.expose,
        security=SecurityConfig(
            authenticator=authenticate if args.token else None,
            audit_hook=audit if args.audit else None,
        ),
        serving=ServingConfig(name="catalogue"),
        tasks="memory://" if args.tasks else None,
    )
    server.serve(args.transport, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
