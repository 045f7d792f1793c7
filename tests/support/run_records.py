"""The run-records isolation property, for any transport: callers with different views
start runs (calls and tasks) on many flows, then every caller lists, reads, subscribes
and guesses ids, and never sees, or can tell apart, a run that is not its own or whose
flow left its view."""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from fastmcp import Client
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.flows import FlowGovernance

from .notices import UPDATED, Heard, listening
from .views import answer, renamed

TEAMS = [f"team{i}" for i in range(4)]
FLOWS = [f"flow{i}" for i in range(8)]
RUNS = "chainweaver://runs"
NEVER_ID = "0" * 24


def owner(flow: str) -> str:
    return TEAMS[int(flow[4:]) % len(TEAMS)]


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read", idempotent=True))
def shout(data: Text) -> Text:
    return Text(text=data.text.upper())


def run_catalogue() -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    executor.register_tool(shout)
    for flow in FLOWS:
        registry.register_flow(Flow(flow, f"Shouts ({flow}).", [FlowStep("shout")],
                                    governance=FlowGovernance(owner=owner(flow))))
    return executor


# Caller ids a key layout must keep apart: separators (`team` listing flow1 and
# `team:flow1` listing everything met in one Redis key before keys were encoded), a
# glob, unicode, the empty id, a percent-escape of another caller's id, and a lone
# surrogate with control characters (a token's "sub": "\udcff\n" gives one; Redis
# keys could not spell it).
HOSTILE_CALLERS = ["team", "team:flow1", "team|flow1", "a/b", "*", "ünï-名", "",
                   "%74eam", "team:", "caller\udcff\n\x1b9"]
# Both sides of the first pair see flow1 first.
SHARED_FLOW_CALLERS = {"team": "team1", "team:flow1": "team1"}


def grants(seed: int, callers: int | list[str] = 10) -> dict[str, list[str]]:
    """``callers`` callers (a count, or their ids), each granted a random set of teams
    (some none; the callers of :data:`SHARED_FLOW_CALLERS` at least their team)."""
    chosen = random.Random(seed)
    names = [f"caller{i}" for i in range(callers)] if isinstance(callers, int) else callers
    given = {name: sorted(chosen.sample(TEAMS, chosen.randint(0, 3))) for name in names}
    for name, team in SHARED_FLOW_CALLERS.items():
        if name in given and team not in given[name]:
            given[name] = sorted([team, *given[name]])
    return given


@dataclass(frozen=True)
class Run:
    run_id: str
    caller: str
    flow: str


# connect(who, message_handler=None): a client whose requests are ``who``'s.
Connect = Callable[..., AbstractAsyncContextManager[Client]]


def visible(teams: list[str]) -> set[str]:
    return {flow for flow in FLOWS if owner(flow) in teams}


async def start_runs(connect: Connect, given: dict[str, list[str]], *,
                     tasks: bool = False) -> list[Run]:
    """Each caller runs every flow in its view (as a background task when ``tasks``)."""
    runs = []
    for who, teams in given.items():
        async with connect(who) as client:
            for flow in sorted(visible(teams)):
                arguments = {"text": f"{ascii(who)} {flow}"}  # text a client can send
                if tasks:
                    from fastmcp_tasks import call_tool_task

                    result: Any = await (await call_tool_task(client, flow, arguments)).result()
                else:
                    result = await client.session.call_tool(flow, arguments)
                assert not result.is_error, result
                runs.append(Run(result.meta["chainweaver"]["run_id"], who, flow))
    return runs


async def all_pages(client: Client, query: str = "") -> list[dict[str, Any]]:
    """Every run of the caller's listing, following cursors (3 a page)."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        uri = f"{RUNS}?limit=3{query}" + (f"&cursor={cursor}" if cursor else "")
        page = (await client.read_resource(uri))[0]
        document = json.loads(page.text)
        found.extend(document["runs"])
        cursor = document["next_cursor"]
        if cursor is None:
            return found


async def read(session: Any, uri: str) -> dict[str, Any]:
    return await answer(lambda: session.read_resource(uri))


async def check_isolation(connect: Connect, given: dict[str, list[str]],
                          runs: list[Run]) -> None:
    """Every caller reads, lists and guesses: only its own runs of flows in its view
    answer; everything else answers exactly like an id that never existed."""
    guesses = [Run(secrets.token_hex(12), "nobody", "flow0") for _ in range(3)]
    for who, teams in given.items():
        mine = [run for run in runs if run.caller == who and run.flow in visible(teams)]
        async with connect(who) as client:
            session = client.session
            never = await read(session, f"{RUNS}/{NEVER_ID}")
            never_output = await read(session, f"{RUNS}/{NEVER_ID}/output")
            assert "error" in never and "error" in never_output
            for run in runs + guesses:
                got = await read(session, f"{RUNS}/{run.run_id}")
                output = await read(session, f"{RUNS}/{run.run_id}/output")
                # Small outputs are never kept: the output of any run reads as missing.
                assert renamed(output, run.run_id, NEVER_ID) == never_output
                if run in mine:
                    assert "result" in got, (who, run)
                    assert run.run_id in str(got)
                else:
                    assert renamed(got, run.run_id, NEVER_ID) == never, (who, run)
            listed = await all_pages(client)
            assert [r["run_id"] for r in listed] == [r.run_id for r in reversed(mine)]
            for flow in [*FLOWS, "zz_never"]:
                by_flow = await all_pages(client, f"&flow={flow}")
                assert {r["run_id"] for r in by_flow} == \
                    {run.run_id for run in mine if run.flow == flow}, (who, flow)
            failed = await all_pages(client, "&status=failed")
            assert failed == []


async def check_subscriptions(connect: Connect, become: Callable[[str], None],
                              given: dict[str, list[str]], runs: list[Run],
                              mode: str) -> None:
    """A caller subscribed to every run URI it can name hears only of its own runs."""
    listener, other = next((who, next(o for o, t in given.items() if o != who and visible(t)))
                           for who, teams in given.items() if visible(teams))
    uris = [RUNS, f"{RUNS}/{NEVER_ID}", *(f"{RUNS}/{run.run_id}" for run in runs)]
    heard = Heard()
    become(listener)
    opening = connect(listener, heard if mode == "legacy" else None)
    async with _subscribed(opening, heard, uris, mode) as client:
        assert client is not None
        become(other)
        async with connect(other) as stranger:
            flow = sorted(visible(given[other]))[0]
            await stranger.session.call_tool(flow, {"text": "x"})
        assert await heard.take(0) == []
        become(listener)
        async with connect(listener) as again:
            flow = sorted(visible(given[listener]))[0]
            await again.session.call_tool(flow, {"text": "x"})
        told = await heard.take(1)
        assert told and set(told) == {f"{UPDATED} {RUNS}"}, told


class _subscribed:
    """A connection subscribed to ``uris``: 2025-11-25 resources/subscribe, or a
    2026-07-28 listen stream."""

    def __init__(self, opening: AbstractAsyncContextManager[Client], heard: Heard,
                 uris: list[str], mode: str) -> None:
        self.opening, self.heard, self.uris, self.mode = opening, heard, uris, mode
        self._listen: Any = None

    async def __aenter__(self) -> Client:
        client = await self.opening.__aenter__()
        if self.mode == "legacy":
            for uri in self.uris:
                await client.session.subscribe_resource(uri)
        else:
            self._listen = listening(client.session, self.heard, self.uris)
            await self._listen.__aenter__()
        return client

    async def __aexit__(self, *exc: Any) -> None:
        if self._listen is not None:
            await self._listen.__aexit__(*exc)
        await self.opening.__aexit__(*exc)
