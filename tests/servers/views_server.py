"""The shared catalogue behind JWT bearer tokens and per-caller views, for subprocess tests.

Serves ``tests/support/catalogue.py`` over streamable HTTP on 127.0.0.1 with
``expose_schemas=True`` and ``expose_prompts=True``. Tokens are verified by FastMCP's
``JWTVerifier`` against the PEM public key in ``--public-key`` (issuer ``--issuer``,
audience ``--audience``); a caller sees the flows whose owner its ``teams`` claim lists.

``--rate-limit N --rate-redis URL [--rate-prefix P]``
    at most N requests per caller per hour, counted in Redis (shared by replicas).
``--audit-log FILE``
    the JSON Lines audit sink.
``--stateless``
    stateless streamable HTTP, as for several replicas behind one load balancer.
``--watch DIR``
    also serve the flow files under DIR, followed while serving (every 0.1 s).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastmcp.server.auth.providers.jwt import JWTVerifier  # noqa: E402
from support.catalogue import build_catalogue  # noqa: E402

from chainweaver.mcp import FlowServer, SecurityConfig, visible_claim  # noqa: E402
from chainweaver.mcp.gate.audit_log import JsonlAuditLog  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--public-key", required=True)
    parser.add_argument("--issuer", default="https://issuer.test")
    parser.add_argument("--audience", default="chainweaver-tests")
    parser.add_argument("--rate-limit", type=int)
    parser.add_argument("--rate-redis")
    parser.add_argument("--rate-prefix", default="chainweaver:rate")
    parser.add_argument("--audit-log")
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--watch")
    args = parser.parse_args()

    verifier = JWTVerifier(public_key=Path(args.public_key).read_text(),
                           issuer=args.issuer, audience=args.audience)
    security: dict[str, Any] = {}
    if args.rate_limit:
        from chainweaver.mcp.gate.rate_limit import RedisRateLimiter

        security["rate_limiter"] = RedisRateLimiter(args.rate_redis, args.rate_limit, 3600,
                                                    prefix=args.rate_prefix)
    if args.audit_log:
        security["audit_hook"] = JsonlAuditLog(args.audit_log, fsync_every=1)
    executor = build_catalogue()
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(**security, auth=verifier,
                                                visible=visible_claim("teams")))
    if args.watch:
        from chainweaver.watch import FlowFileWatcher

        server.watch(FlowFileWatcher(executor.registry, args.watch, tools=executor.tools,
                                     interval=0.1))
    server.serve("streamable-http", host="127.0.0.1", port=args.port,
                 stateless=args.stateless)


if __name__ == "__main__":
    main()
