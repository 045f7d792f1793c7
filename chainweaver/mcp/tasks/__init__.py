"""Flows as MCP background tasks (the tasks extra): the extension, its runner, and
setting them up on a server or a worker."""
