"""What a client is told of changes, on either protocol era, as comparable strings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.client.subscriptions import listen

TOOLS = "notifications/tools/list_changed"
RESOURCES = "notifications/resources/list_changed"
PROMPTS = "notifications/prompts/list_changed"
UPDATED = "notifications/resources/updated"
# 2026-07-28 listen events, named as the 2025-11-25 notifications they stand for.
EVENTS = {"ToolsListChanged": TOOLS, "ResourcesListChanged": RESOURCES,
          "PromptsListChanged": PROMPTS, "ResourceUpdated": UPDATED}


class Heard:
    """What one client was told, by notification method (and URI)."""

    def __init__(self) -> None:
        self.told: list[str] = []

    async def __call__(self, message: Any) -> None:  # a 2025-11-25 message handler
        method = getattr(message, "method", None)
        if method is not None and method.startswith("notifications/"):
            uri = getattr(getattr(message, "params", None), "uri", None)
            self.told.append(f"{method} {uri}" if uri else method)

    async def take(self, expected: int, quiet: float = 0.3) -> list[str]:
        """Wait (bounded) for ``expected`` notices, then ``quiet`` s for any extra one;
        what was told, sorted, and forget it."""
        for _ in range(400):
            if len(self.told) >= expected:
                break
            await asyncio.sleep(0.025)
        await asyncio.sleep(quiet)
        told, self.told = sorted(self.told), []
        return told


@asynccontextmanager
async def listening(session: Any, heard: Heard, uris: list[str]) -> AsyncIterator[Heard]:
    """A 2026-07-28 listen stream asking for every kind (and ``uris``), told to ``heard``."""
    async with listen(session, tools_list_changed=True, prompts_list_changed=True,
                      resources_list_changed=True, resource_subscriptions=uris) as stream:

        async def drain() -> None:
            async for event in stream:
                name = EVENTS[type(event).__name__]
                uri = getattr(event, "uri", None)
                heard.told.append(f"{name} {uri}" if uri else name)

        task = asyncio.create_task(drain())
        try:
            yield heard
        finally:
            task.cancel()
