"""The regression test the whole product depends on.

Flows excluded for each reason (lifecycle, owner, unknown safety, side effects,
approval, not named in ``flow_names``) are served with ``expose_schemas=True`` and
``expose_prompts=True``. None of them may appear in, or be reachable through, tools,
resources, resource templates, prompts, the index, the guide or completions; every
exposed flow must be present in all of them. Checked in memory, over streamable HTTP
(a subprocess), and as a property over random registries and policies.

Run as a script (``python test_mcp_regression.py --port N``) this module serves the
fixed registry over streamable HTTP, for the subprocess test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import MCPError
from pydantic import Field, create_model
from support.mcp_client import (
    EXCLUDED_NAMES,
    assert_not_found_like_never,
    complete,
    complete_template,
    exposing,
    prompt_error,
    prompting,
    read_error,
    read_text,
    schema_uri,
)
from support.procs import free_port, stop, wait_until_listening

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowPrompt,
    FlowRegistry,
    FlowStep,
    PromptArgument,
    PromptMessage,
    SideEffectLevel,
    Tool,
    ToolSafetyContract,
)
from chainweaver.mcp import AuditEvent, ExposurePolicy, FlowServer, GateContext, SecurityConfig

GUIDE = "chainweaver_guide"
INDEX = "chainweaver://flows"
TEMPLATE = "chainweaver://flows/{published_name}/schema"
NEVER = "never_existed_anywhere"

NONE = ToolSafetyContract(SideEffectLevel.NONE)
READ = ToolSafetyContract(SideEffectLevel.READ)
SAFETIES: dict[str, ToolSafetyContract | None] = {
    "unknown": None,
    "none": NONE,
    "read": READ,
    "write": ToolSafetyContract(SideEffectLevel.WRITE),
    "destructive": ToolSafetyContract(SideEffectLevel.DESTRUCTIVE),
    "external": ToolSafetyContract(SideEffectLevel.EXTERNAL, open_world=True),
    "approval": ToolSafetyContract(SideEffectLevel.READ, requires_approval=True,
                                   approval_reason="touches personal data"),
}


@dataclass(frozen=True)
class Spec:
    """One flow of a test registry. Its name appears in everything derived from it."""

    name: str
    lifecycle: str = "active"
    owner: str | None = "core"
    tool_safety: str = "read"
    flow_safety: str | None = None  # a flow-level contract overrides the tool's

    @property
    def safety(self) -> ToolSafetyContract | None:
        return SAFETIES[self.flow_safety or self.tool_safety]


@dataclass(frozen=True)
class Policy:
    flow_names: frozenset[str] | None = None
    owners: frozenset[str] | None = None
    lifecycles: frozenset[str] = frozenset({"active"})
    side_effects: frozenset[str] = frozenset({"none", "read"})
    allow_approval: bool = False
    prefix: str = ""

    def server(self, executor: FlowExecutor) -> FlowServer:
        return FlowServer(
            executor,
            expose_schemas=True,
            expose_prompts=True,
            policy=ExposurePolicy(
                flow_names=self.flow_names,
                owners=self.owners,
                allowed_lifecycles=self.lifecycles,
                allowed_side_effects=self.side_effects,
                allow_requires_approval=self.allow_approval,
                server_prefix=self.prefix,
            ),
        )

    def exposes(self, spec: Spec) -> bool:
        """The documented rules, written down independently of the library."""
        safety = spec.safety
        return ((self.flow_names is None or spec.name in self.flow_names)
                and spec.lifecycle in self.lifecycles
                and (self.owners is None or spec.owner in self.owners)
                and safety is not None
                and safety.side_effects.value in self.side_effects
                and (self.allow_approval or not safety.requires_approval))

    def published(self, name: str) -> str:
        return f"{self.prefix}__{name}" if self.prefix else name


def build_registry(specs: Sequence[Spec]) -> FlowExecutor:
    """A registry where every flow has its own tool, input model, enum values and prompt."""
    executor = FlowExecutor(FlowRegistry())
    for spec in specs:
        name = spec.name
        model = create_model(
            f"{name}_input",
            choice=(Literal[(f"{name}-choice-a", f"{name}-choice-b")],
                    Field(description=f"Mode of {name}")),
            note=(str, Field(description=f"Note for {name}", examples=[f"{name}-example"])),
            strict=(bool, Field(False, description=f"Strict {name}")),
        )
        executor.register_tool(Tool(
            f"{name}_tool", f"Tool of {name}.", model, None,
            lambda data: {"ok": True}, safety=SAFETIES[spec.tool_safety],
        ))
        executor.registry.register_flow(Flow(
            name, f"Description of {name}.", [FlowStep(f"{name}_tool")],
            title=f"Title of {name}",
            governance=FlowGovernance(spec.lifecycle, owner=spec.owner),
            safety=SAFETIES[spec.flow_safety] if spec.flow_safety else None,
            prompts=[FlowPrompt(
                "explain", title=f"Explain {name}",
                arguments=[PromptArgument("topic", f"Topic for {name}", required=True)],
                messages=[PromptMessage("user", f"Explain {{{{ topic }}}} with {name}.")],
            )],
        ))
    return executor


# ------------------------------------------------------------- the check itself


def sample_arguments(prompt: mcp_types.Prompt, schema: dict[str, Any] | None) -> dict[str, str]:
    values = {}
    for argument in prompt.arguments or ():
        if not argument.required:
            continue
        prop = (schema or {}).get("properties", {}).get(argument.name, {})
        values[argument.name] = (prop.get("examples") or prop.get("enum") or ["value"])[0]
    return values


async def error_of(request: Any) -> dict[str, Any]:
    with pytest.raises(MCPError) as caught:
        await request
    return caught.value.error.model_dump()


def as_if_for(answer: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """``answer`` as it would read for ``new`` instead of ``old`` (names are quoted)."""
    return json.loads(json.dumps(answer).replace(old, new))


async def assert_exposure_is_airtight(
    client: Client, exposed: Sequence[str], excluded: Sequence[str], policy: Policy,
) -> None:
    """Every exposed flow is in every primitive; no excluded flow is in or behind any."""
    seen: list[str] = []  # everything the client could learn, as JSON text
    names = [policy.published(n) for n in exposed]

    tools = {t.name: t for t in await client.list_tools()}
    resources = [str(r.uri) for r in await client.list_resources()]
    templates = await client.list_resource_templates()
    prompts = {p.name: p for p in await client.list_prompts()}
    seen += [t.model_dump_json() for t in tools.values()]
    seen += [json.dumps(resources), *(t.model_dump_json() for t in templates)]
    seen += [p.model_dump_json() for p in prompts.values()]

    assert sorted(tools) == sorted(names)
    assert sorted(resources) == sorted(
        [INDEX, *(f"chainweaver://flows/{n}/schema" for n in names)])
    assert [t.uri_template for t in templates] == [TEMPLATE]
    assert set(prompts) == {GUIDE} | set(names) | {f"{n}__explain" for n in names}

    for uri in resources:
        seen += [c.text for c in await client.read_resource(uri)]
    index = json.loads((await client.read_resource(INDEX))[0].text)
    assert sorted(entry["tool_name"] for entry in index["flows"]) == sorted(names)
    for entry in index["flows"]:
        assert entry["prompts"] == [entry["tool_name"], f"{entry['tool_name']}__explain"]

    for name, prompt in prompts.items():
        schema = tools[name].input_schema if name in tools else None
        rendered = await client.get_prompt(name, sample_arguments(prompt, schema))
        seen.append(rendered.model_dump_json())
    guide = "\n".join(m.content.text for m in (await client.get_prompt(GUIDE)).messages)
    for name in names:
        assert f"`{name}`" in guide

    template = mcp_types.ResourceTemplateReference(uri=TEMPLATE)
    offered = (await client.complete(template, {"name": "published_name", "value": ""})).values
    assert sorted(offered) == sorted(names)
    seen.append(json.dumps(offered))
    for name in names:
        reference = mcp_types.PromptReference(name=name)
        choices = await client.complete(reference, {"name": "choice", "value": ""})
        flow = exposed[names.index(name)]
        assert choices.values == [f"{flow}-choice-a", f"{flow}-choice-b"]
        for argument in ("note", "strict", "topic"):
            seen.append(json.dumps((await client.complete(
                reference, {"name": argument, "value": ""})).values))

    # Nothing derived from an excluded flow shows up anywhere: names, titles,
    # descriptions, schemas, enum values and prompts all carry the flow's name.
    everything = "\n".join(seen)
    for flow in excluded:
        assert flow not in everything, flow

    # ...and nothing is reachable by asking for it: every answer equals the answer for
    # a name that never existed.
    never_call = (await client.call_tool_mcp(NEVER, {})).model_dump()
    never_uri = f"chainweaver://flows/{NEVER}/schema"
    never_read = await error_of(client.session.read_resource(never_uri))
    never_prompt = await error_of(client.session.get_prompt(NEVER, {"topic": "t"}))
    for flow in excluded:
        for name in {flow, policy.published(flow)}:
            call = (await client.call_tool_mcp(name, {"choice": f"{flow}-choice-a"}))
            assert call.model_dump() == as_if_for(never_call, NEVER, name)
            uri = f"chainweaver://flows/{name}/schema"
            assert await error_of(client.session.read_resource(uri)) == as_if_for(
                never_read, NEVER, name)
            for prompt in (name, f"{name}__explain"):
                assert await error_of(client.session.get_prompt(prompt, {"topic": "t"})) == (
                    as_if_for(never_prompt, NEVER, prompt))
                reference = mcp_types.PromptReference(name=prompt)
                for argument in ("choice", "strict", "note"):
                    completion = await client.complete(reference,
                                                        {"name": argument, "value": ""})
                    assert completion.values == []
            offered = await client.complete(template, {"name": "published_name", "value": name})
            assert offered.values == []


# ------------------------------------------------------------ the fixed registry


SPECS = [
    Spec("atlas_lookup"),
    Spec("beacon_quote", tool_safety="none"),
    Spec("comet_count", tool_safety="unknown", flow_safety="read"),
    Spec("draft_vault", lifecycle="draft"),
    Spec("archived_vault", lifecycle="archived"),
    Spec("foreign_vault", owner="other-team"),
    Spec("ownerless_vault", owner=None),
    Spec("mystery_vault", tool_safety="unknown"),
    Spec("writer_vault", tool_safety="write"),
    Spec("eraser_vault", tool_safety="destructive"),
    Spec("mailer_vault", tool_safety="external"),
    Spec("approval_vault", tool_safety="approval"),
    Spec("hidden_vault"),
]
REASONS = {
    "draft_vault": "lifecycle 'draft' is not allowed",
    "archived_vault": "lifecycle 'archived' is not allowed",
    "foreign_vault": "owner 'other-team' is not allowed",
    "ownerless_vault": "owner None is not allowed",
    "mystery_vault": "effective safety is unknown",
    "writer_vault": "side effects 'write' are not allowed",
    "eraser_vault": "side effects 'destructive' are not allowed",
    "mailer_vault": "side effects 'external' are not allowed",
    "approval_vault": "requires approval (touches personal data)",
    "hidden_vault": "not listed in flow_names",
}
POLICY = Policy(flow_names=frozenset(s.name for s in SPECS) - {"hidden_vault"},
                owners=frozenset({"core"}))
EXPOSED = ["atlas_lookup", "beacon_quote", "comet_count"]


def regression_server() -> FlowServer:
    return POLICY.server(build_registry(SPECS))


def test_the_fixed_registry_excludes_each_flow_for_its_own_reason() -> None:
    report = {e.flow_name: e for e in regression_server().exposure_report()}
    assert sorted(n for n, e in report.items() if e.exposed) == EXPOSED
    assert [s.name for s in SPECS if POLICY.exposes(s)] == EXPOSED
    for name, reason in REASONS.items():
        assert not report[name].exposed and reason in report[name].reason, report[name]
        assert report[name].resource_uris == report[name].prompt_names == ()


@pytest.mark.anyio
async def test_excluded_flows_are_absent_and_unreachable_in_memory() -> None:
    async with Client(regression_server().fastmcp) as client:
        await assert_exposure_is_airtight(client, EXPOSED, list(REASONS), POLICY)
        # The exposed ones are not just listed: they run.
        for name in EXPOSED:
            result = await client.call_tool(name, {"choice": f"{name}-choice-b", "note": "n"})
            assert json.loads(result.content[0].text) == {"ok": True}


# Run as a script, this module imports the shared helpers from the tests folder.
TESTS_ON_PATH = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


@pytest.fixture(scope="module")
def http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """This module, run as a script: the fixed registry over streamable HTTP."""
    port = free_port()
    log = tmp_path_factory.mktemp("regression-http") / "server.log"
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                    "--port", str(port)], stdout=output,
                                   stderr=subprocess.STDOUT, env=TESTS_ON_PATH)
        try:
            wait_until_listening(process, port)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            stop(process)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_excluded_flows_are_absent_and_unreachable_over_streamable_http(
    http_url: str, mode: str,
) -> None:
    async with Client(StreamableHttpTransport(http_url), mode=mode) as client:
        await assert_exposure_is_airtight(client, EXPOSED, list(REASONS), POLICY)


# ------------------------------------ the shared catalogue, primitive by primitive


@pytest.mark.anyio
@pytest.mark.parametrize("name", [*EXCLUDED_NAMES, "draft_report__secret"])
async def test_excluded_prompt_names_answer_exactly_like_names_that_never_existed(
    name: str,
) -> None:
    async with Client(prompting(expose_schemas=True).fastmcp) as client:
        listed = {p.name for p in await client.list_prompts()}
        error = await prompt_error(client, name, {"query": "q"})
        never = await prompt_error(client, NEVER, {"query": "q"})
    assert name not in listed
    assert never.model_dump() == {"code": -32602, "message": f"Unknown prompt: {NEVER!r}",
                                  "data": None}
    assert error.model_dump() == {**never.model_dump(),
                                  "message": never.message.replace(repr(NEVER), repr(name))}


@pytest.mark.anyio
async def test_completion_of_excluded_flows_offers_nothing_even_when_they_have_choices() -> None:
    # The same flow offers its enum once published and nothing while excluded.
    published = prompting(policy=ExposurePolicy(allowed_lifecycles=["active", "draft"]))
    async with Client(published.fastmcp) as client:
        assert await complete(client, "draft_report", "sort") == ["relevance", "price"]
    async with Client(prompting().fastmcp) as client:
        assert await complete(client, "draft_report", "sort") == []
        assert await complete(client, "draft_report", "in_stock") == []


@pytest.mark.anyio
@pytest.mark.parametrize("name", EXCLUDED_NAMES)
async def test_an_excluded_flow_has_no_resource_and_answers_like_a_never_existing_uri(
    name: str,
) -> None:
    server = exposing(expose_prompts=True)
    async with Client(server.fastmcp) as client:
        listed = {str(r.uri) for r in await client.list_resources()}
        index = await read_text(client, INDEX)
        await assert_not_found_like_never(client, schema_uri(name))
        assert name not in await complete_template(client, "")
    assert not any(name in uri for uri in listed)
    assert name not in index


@pytest.mark.anyio
async def test_hooks_cannot_tell_an_excluded_uri_from_a_never_existing_one() -> None:
    seen: list[GateContext] = []
    events: list[AuditEvent] = []

    def authorize(ctx: GateContext) -> bool:
        seen.append(ctx)
        return True

    server = exposing(security=SecurityConfig(authorizer=authorize, audit_hook=events.append))
    async with Client(server.fastmcp) as client:
        await read_error(client, schema_uri("write_flow"))
        await read_error(client, schema_uri(NEVER))
    excluded, never = seen
    assert (excluded.kind, excluded.flow_name, excluded.flow_version) == ("resource", None, None)
    assert (never.kind, never.flow_name, never.flow_version) == ("resource", None, None)
    outcomes = [(e.outcome, e.error_type) for e in events if e.phase == "completed"]
    assert outcomes == [("error", "NotFoundError"), ("error", "NotFoundError")]


# ------------------------------------------------------ random registries, policies


LIFECYCLES = ["draft", "reviewed", "active", "archived"]
SIDE_EFFECTS = ["none", "read", "write", "destructive", "external"]
OWNERS = ["core", "ops", None]


@st.composite
def registries_and_policies(draw: st.DrawFn) -> tuple[list[Spec], Policy]:
    count = draw(st.integers(1, 6))
    specs = [Spec(
        f"flow_{index:02d}",
        lifecycle=draw(st.sampled_from(LIFECYCLES)),
        owner=draw(st.sampled_from(OWNERS)),
        tool_safety=draw(st.sampled_from(sorted(SAFETIES))),
        flow_safety=draw(st.none() | st.sampled_from(sorted(s for s in SAFETIES
                                                           if s != "unknown"))),
    ) for index in range(count)]
    names = [s.name for s in specs]
    policy = Policy(
        flow_names=draw(st.none() | st.sets(st.sampled_from(names)).map(frozenset)),
        owners=draw(st.none() | st.sets(st.sampled_from(["core", "ops"])).map(frozenset)),
        lifecycles=draw(st.sets(st.sampled_from(LIFECYCLES), min_size=1).map(frozenset)),
        side_effects=draw(st.sets(st.sampled_from(SIDE_EFFECTS), min_size=1).map(frozenset)),
        allow_approval=draw(st.booleans()),
        prefix=draw(st.sampled_from(["", "edge"])),
    )
    return specs, policy


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registries_and_policies())
def test_exposure_is_airtight_for_random_registries_and_policies(
    case: tuple[list[Spec], Policy],
) -> None:
    specs, policy = case
    exposed = [s.name for s in specs if policy.exposes(s)]
    excluded = [s.name for s in specs if not policy.exposes(s)]
    server = policy.server(build_registry(specs))
    report = {e.flow_name: e for e in server.exposure_report()}
    assert sorted(n for n, e in report.items() if e.exposed) == sorted(exposed)

    async def check() -> None:
        async with Client(server.fastmcp) as client:
            await assert_exposure_is_airtight(client, exposed, excluded, policy)

    anyio.run(check)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    regression_server().serve("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
