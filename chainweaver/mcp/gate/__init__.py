"""The security gate: one admission per request (authenticate, resolve in the caller's
view, rate-limit, authorize, audit), its hooks, views, limits, audit log and HTTP guard,
and how it stays in charge under FastMCP composition."""
