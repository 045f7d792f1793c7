"""A background task's run belongs to the caller the gate admitted, whatever its id holds:
the empty id (an ``authenticator`` hook's identity) once became ``anonymous`` in the
task's worker, so its run (steps, output digest, linked output) was filed under the
caller ``anonymous`` and read by it, while its own caller was left a record that said
``running`` forever (the second adversarial pass of issue 32)."""

from __future__ import annotations

import json

import pytest
from fastmcp import Client
from mcp import MCPError
from support.run_records import run_catalogue

from chainweaver.mcp import CallerIdentity, FlowServer, GateContext, SecurityConfig, ServingConfig
from chainweaver.mcp.config import RunHistory

pytestmark = [pytest.mark.anyio, pytest.mark.tasks]


class Switch:
    def __init__(self) -> None:
        self.who = ""

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who)


@pytest.mark.parametrize("caller", ["", " ", "0"])
async def test_a_task_run_stays_its_callers_whatever_the_id(caller: str) -> None:
    from fastmcp_tasks import call_tool_task

    switch = Switch()
    server = FlowServer(run_catalogue(), security=SecurityConfig(authenticator=switch),
                        serving=ServingConfig(run_history=RunHistory(output_limit=10)),
                        tasks="memory://")
    switch.who = caller
    async with Client(server.fastmcp) as client:
        task = await call_tool_task(client, "flow1", {"text": "private"},
                                    raise_on_error=False)
        result = await task.result()
        run_id = result.meta["chainweaver"]["run_id"]
        output = result.meta["chainweaver"]["output"]["uri"]
        listed = json.loads((await client.read_resource("chainweaver://runs"))[0].text)
        assert [(run["run_id"], run["status"]) for run in listed["runs"]] == \
            [(run_id, "completed")]
        assert (await client.read_resource(output))[0].text == '{"text": "PRIVATE"}'
    switch.who = "anonymous"
    async with Client(server.fastmcp) as client:
        listed = json.loads((await client.read_resource("chainweaver://runs"))[0].text)
        assert listed["runs"] == []
        with pytest.raises(MCPError, match="Resource not found"):
            await client.read_resource(output)
