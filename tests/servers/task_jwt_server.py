"""The task flows (tests/servers/task_flows) behind JWT bearer tokens and a per-caller
view, for subprocess tests: a caller sees the flows its ``flows`` claim lists. Tasks run
in memory; tokens are verified against the PEM public key given as the second argument.

Usage: ``task_jwt_server.py PORT PUBLIC_KEY_FILE`` (serves streamable HTTP on 127.0.0.1).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastmcp.server.auth.providers.jwt import JWTVerifier  # noqa: E402
from servers import task_tools  # noqa: E402
from support.tokens import AUDIENCE, ISSUER  # noqa: E402

from chainweaver.executor import FlowExecutor  # noqa: E402
from chainweaver.files import find_flow_files, load_flows  # noqa: E402
from chainweaver.mcp import ExposurePolicy, FlowServer, SecurityConfig, Visibility  # noqa: E402
from chainweaver.registry import FlowRegistry  # noqa: E402

FLOWS = Path(__file__).resolve().parent / "task_flows"


def main() -> None:
    port, key = int(sys.argv[1]), Path(sys.argv[2]).read_text()
    executor = FlowExecutor(FlowRegistry())
    for tool in (task_tools.fetch, task_tools.enrich, task_tools.finish, task_tools.charge,
                 task_tools.lookup, task_tools.refund):
        executor.register_tool(tool)
    for flow in load_flows(find_flow_files([FLOWS]), tools=executor.tools):
        executor.registry.register_flow(flow)
    rule = Visibility(lambda caller, flow: flow.name in caller.claims.get("flows", []),
                      claims=("flows",))
    server = FlowServer(executor, tasks="memory://",
                        policy=ExposurePolicy(allowed_side_effects=["read", "write"]),
                        security=SecurityConfig(
                            visible=rule,
                            auth=JWTVerifier(public_key=key, issuer=ISSUER, audience=AUDIENCE)))
    server.serve("streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
