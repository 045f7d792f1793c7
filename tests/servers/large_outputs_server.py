"""A server whose flows return outputs of any size, for the wire-limit tests:
``python large_outputs_server.py (stdio | streamable-http PORT) [--history]``.

``blob`` returns ``{"data": ch * n}``; ``typed_blob`` the same under an output schema.
Every call's audit record is written to stderr as one JSON line (``AUDIT <json>``).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig
from chainweaver.mcp.config import RunHistory


class Size(BaseModel):
    n: int
    ch: str = "x"


class Blob(BaseModel):
    data: str


@tool(safety=ToolSafetyContract("read"))
def make_blob(size: Size) -> dict:
    return {"data": size.ch * size.n}


@tool(safety=ToolSafetyContract("read"))
def make_typed_blob(size: Size) -> Blob:
    return Blob(data=size.ch * size.n)


def audit(event: AuditEvent) -> None:
    if event.phase == "completed":
        print("AUDIT " + json.dumps(dataclasses.asdict(event)), file=sys.stderr, flush=True)


def main() -> None:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(make_blob)
    executor.register_tool(make_typed_blob)
    registry.register_flow(Flow("blob", "Any size of output.", [FlowStep("make_blob")]))
    registry.register_flow(Flow("typed_blob", "Any size, typed.", [FlowStep("make_typed_blob")],
                                output_schema=Blob))
    history = RunHistory() if "--history" in sys.argv else None
    server = FlowServer(executor, security=SecurityConfig(audit_hook=audit), run_history=history)
    if sys.argv[1] == "stdio":
        server.serve()
    else:
        server.serve("streamable-http", port=int(sys.argv[2]))


if __name__ == "__main__":
    main()
