"""A flow run that talks to its MCP client (progress, log messages, approval), and its
traces."""
