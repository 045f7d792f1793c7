"""The exposure decision: which flows a FlowServer publishes, under which names, and why not.

Everything is checked through the public API: the constructor, ``exposure_report()``,
``registered_tool_names`` and what a real MCP client lists.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
from fastmcp import Client
from pydantic import BaseModel, ConfigDict
from support.catalogue import EXCLUDED, EXPOSED, build_catalogue

from chainweaver import (
    ExposureConfigError,
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    Tool,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import ExposurePolicy, FlowServer, SecurityConfig
from chainweaver.mcp.publish.exposure import Exposure

EXCLUDED_NAMES = sorted(name for name, why in EXCLUDED.items() if why is not None)


def report_by_name(server: FlowServer) -> dict[str, object]:
    return {entry.flow_name: entry for entry in server.exposure_report()}


async def listed_tool_names(server: FlowServer) -> list[str]:
    async with Client(server.fastmcp) as client:
        return sorted(t.name for t in await client.list_tools())


# ------------------------------------------------------------------ import guard


@pytest.mark.slow
def test_missing_mcp_extra_gives_an_install_hint_and_the_core_still_works() -> None:
    # A fresh interpreter where ``fastmcp`` cannot be imported, as without the extra.
    script = textwrap.dedent(
        """
        import importlib.abc
        import sys

        class BlockFastMCP(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "fastmcp" or name.startswith("fastmcp."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, BlockFastMCP())

        from pydantic import BaseModel
        from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, tool

        class In(BaseModel):
            n: int

        @tool
        def double(data: In) -> dict:
            return {"n": data.n * 2}

        executor = FlowExecutor(FlowRegistry())
        executor.register_tool(double)
        executor.registry.register_flow(Flow("twice", "Double it.", [FlowStep("double")]))
        print("core:", executor.execute_flow("twice", {"n": 21}).final_output)
        print("fastmcp imported by core:", "fastmcp" in sys.modules)
        try:
            from chainweaver.mcp import FlowServer
        except ImportError as error:
            print("import error:", error)
        else:
            print("imported", FlowServer)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "core: {'n': 42}" in lines
    assert "fastmcp imported by core: False" in lines
    errors = [line for line in lines if line.startswith("import error:")]
    assert len(errors) == 1, done.stdout
    assert "pip install -e '.[mcp]' in a clone of ChainWeaver" in errors[0]


# ---------------------------------------------------------------- default policy


@pytest.mark.anyio
async def test_default_policy_publishes_exactly_the_safe_active_flows() -> None:
    server = FlowServer(build_catalogue())
    assert server.registered_tool_names == sorted(EXPOSED)
    assert await listed_tool_names(server) == sorted(EXPOSED)


def test_report_has_one_entry_per_registered_flow_name_with_a_reason_for_each_exclusion() -> None:
    executor = build_catalogue()
    server = FlowServer(executor)
    report = server.exposure_report()
    assert [entry.flow_name for entry in report] == executor.registry.flow_names()
    by_name = report_by_name(server)
    # order_status has two versions; the report speaks about the latest only.
    assert by_name["order_status"].version == "2.1.0"
    for name in EXPOSED:
        entry = by_name[name]
        assert entry.exposed and entry.reason is None and not entry.forced
        assert entry.tool_name == name
    expected_words = {
        "lifecycle": "lifecycle",
        "unknown safety": "safety is unknown",
        "side effects": "side effects",
        "approval": "requires approval",
    }
    for name in EXCLUDED_NAMES:
        entry = by_name[name]
        assert not entry.exposed
        assert entry.tool_name is None
        assert entry.resource_uris == () and entry.prompt_names == ()
        assert expected_words[EXCLUDED[name]] in entry.reason, (name, entry.reason)


def test_reasons_are_specific_and_human_readable() -> None:
    by_name = report_by_name(FlowServer(build_catalogue()))
    assert by_name["draft_report"].reason == (
        "lifecycle 'draft' is not allowed (allowed: active)")
    assert "'archived'" in by_name["archived_search"].reason
    assert "'untyped_lookup'" in by_name["unknown_safety"].reason
    assert "'destructive'" in by_name["destructive_flow"].reason
    assert "'external'" in by_name["external_flow"].reason
    assert "reads personal data" in by_name["needs_approval"].reason
    assert "allow_requires_approval" in by_name["needs_approval"].reason


def test_each_excluded_flow_is_logged_once_at_warning_when_first_decided(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="chainweaver.mcp"):
        server = FlowServer(build_catalogue())
        server.exposure_report()  # the whole catalogue is decided here (or on a list)
        server.exposure_report()
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "chainweaver.mcp"]
    for name in EXCLUDED_NAMES:
        mentioning = [m for m in warnings if f"'{name}'" in m]
        assert len(mentioning) == 1, (name, warnings)
    for name in EXPOSED:
        assert not any(f"'{name}'" in m for m in warnings)


@pytest.mark.anyio
async def test_exclusions_are_not_logged_again_when_clients_list_or_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FlowServer(build_catalogue())
    server.exposure_report()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="chainweaver.mcp"):
        async with Client(server.fastmcp) as client:
            await client.list_tools()
            await client.call_tool("write_flow", {"query": "x"}, raise_on_error=False)
    assert not [r for r in caplog.records if "not exposed" in r.getMessage()]


@pytest.mark.anyio
async def test_construction_decides_no_flow_and_a_lookup_decides_only_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="chainweaver.mcp"):
        server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
        assert not caplog.records  # nothing judged yet: start does not visit the catalogue
        async with Client(server.fastmcp) as client:
            await client.read_resource("chainweaver://flows/order_status/schema")
            assert not caplog.records  # an exposed flow: decided, and nothing to say
            # FastMCP 4.2 answers a name its providers do not return by listing every
            # tool (looking for another version), so a hidden name's call may decide
            # the rest of the catalogue there; its own decision is logged either way.
            called = await client.session.call_tool("write_flow", {"query": "x"})
    assert called.is_error
    decided = [r.getMessage() for r in caplog.records]
    assert decided[0] == ("flow 'write_flow' v1.0.0 is not exposed: side effects 'write' "
                          "are not allowed (allowed: none, read)")
    assert len(decided) == len(set(decided))  # each flow is decided at most once


# ----------------------------------------------------------------- policy knobs


def test_flow_names_restricts_the_candidates() -> None:
    server = FlowServer(
        build_catalogue(),
        policy=ExposurePolicy(flow_names=["order_status", "write_flow"]),
    )
    assert server.registered_tool_names == ["order_status"]
    by_name = report_by_name(server)
    assert by_name["product_search"].reason == "not listed in flow_names"
    # Listed but still filtered: flow_names does not bypass governance.
    assert "side effects" in by_name["write_flow"].reason


def test_unknown_flow_name_is_a_construction_error() -> None:
    with pytest.raises(ExposureConfigError, match="no_such_flow"):
        FlowServer(
            build_catalogue(),
            policy=ExposurePolicy(flow_names=["product_search", "no_such_flow"]),
        )


def test_flow_names_must_be_a_list_not_a_string() -> None:
    with pytest.raises(ExposureConfigError):
        FlowServer(build_catalogue(), policy=ExposurePolicy(flow_names="product_search"))


def test_allowed_lifecycles_admits_drafts_when_asked() -> None:
    server = FlowServer(
        build_catalogue(),
        policy=ExposurePolicy(allowed_lifecycles=["active", "draft"]),
    )
    assert "draft_report" in server.registered_tool_names
    assert "archived_search" not in server.registered_tool_names
    assert "allowed: active, draft" in report_by_name(server)["archived_search"].reason


def test_owners_filter_keeps_only_listed_owners() -> None:
    server = FlowServer(build_catalogue(), policy=ExposurePolicy(owners=["search-team"]))
    assert server.registered_tool_names == ["failing_flow", "product_search"]
    reason = report_by_name(server)["order_status"].reason
    assert "owner 'orders-team' is not allowed" in reason and "search-team" in reason


def test_allowed_side_effects_widens_and_narrows_the_filter() -> None:
    wide = FlowServer(
        build_catalogue(),
        policy=ExposurePolicy(allowed_side_effects=["none", "read", "write"]),
    )
    assert {"write_flow", "idempotent_write"} <= set(wide.registered_tool_names)
    assert "destructive_flow" not in wide.registered_tool_names
    narrow = FlowServer(
        build_catalogue(),
        policy=ExposurePolicy(allowed_side_effects=[SideEffectLevel.NONE]),
    )
    assert narrow.registered_tool_names == ["price_quote"]
    assert "'read' are not allowed" in report_by_name(narrow)["product_search"].reason


def test_invalid_policy_values_are_construction_errors() -> None:
    with pytest.raises(ExposureConfigError):
        FlowServer(build_catalogue(), policy=ExposurePolicy(allowed_side_effects=["sideways"]))
    with pytest.raises(ExposureConfigError):
        FlowServer(build_catalogue(), policy=ExposurePolicy(allowed_lifecycles=["retired"]))
    with pytest.raises(ExposureConfigError):
        FlowServer(build_catalogue(), security=SecurityConfig(error_detail="everything"))


def test_allow_requires_approval_publishes_approval_flows() -> None:
    server = FlowServer(build_catalogue(), policy=ExposurePolicy(allow_requires_approval=True))
    assert "needs_approval" in server.registered_tool_names


def test_unknown_safety_is_never_published_by_policy_alone() -> None:
    # Even the widest policy cannot vouch for a flow whose safety nobody declared.
    server = FlowServer(
        build_catalogue(),
        policy=ExposurePolicy(
            allowed_lifecycles=["draft", "reviewed", "active", "archived"],
            allowed_side_effects=list(SideEffectLevel),
            allow_requires_approval=True,
        ),
    )
    assert server.registered_tool_names == sorted(set(EXPOSED) | set(EXCLUDED_NAMES)
                                                  - {"unknown_safety"})


def test_a_flow_safety_contract_overrides_its_tools() -> None:
    executor = build_catalogue()
    executor.registry.register_flow(Flow(
        "vouched_lookup", "Lookup with a declared contract.", [FlowStep("untyped_lookup")],
        safety=ToolSafetyContract(SideEffectLevel.READ),
    ))
    assert "vouched_lookup" in FlowServer(executor).registered_tool_names


# ------------------------------------------------------------------ force_expose


def test_force_expose_bypasses_filters_only_for_named_flows_and_warns_for_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="chainweaver.mcp"):
        server = FlowServer(
            build_catalogue(),
            policy=ExposurePolicy(
                force_expose=True,
                flow_names=["destructive_flow", "unknown_safety", "product_search"],
            ),
        )
    assert server.registered_tool_names == ["destructive_flow", "product_search",
                                            "unknown_safety"]
    by_name = report_by_name(server)
    assert by_name["destructive_flow"].forced and by_name["unknown_safety"].forced
    # A flow that passes the filters is not "forced".
    assert not by_name["product_search"].forced
    # Not named: excluded, even with force_expose.
    assert not by_name["write_flow"].exposed
    forced_warnings = [r.getMessage() for r in caplog.records
                       if r.levelno == logging.WARNING and "force_expose" in r.getMessage()]
    assert len(forced_warnings) == 2
    assert any("'destructive_flow'" in m for m in forced_warnings)
    assert any("'unknown_safety'" in m for m in forced_warnings)


def test_force_expose_without_flow_names_is_a_construction_error() -> None:
    with pytest.raises(ExposureConfigError, match="flow_names"):
        FlowServer(build_catalogue(), policy=ExposurePolicy(force_expose=True))


def test_force_expose_never_publishes_a_flow_that_cannot_run() -> None:
    executor = build_catalogue()
    executor.registry.register_flow(Flow("broken", "Uses a missing tool.",
                                         [FlowStep("no_such_tool")]))
    server = FlowServer(
        executor,
        policy=ExposurePolicy(force_expose=True, flow_names=["broken", "product_search"]),
    )
    assert server.registered_tool_names == ["product_search"]
    reason = report_by_name(server)["broken"].reason
    assert reason.startswith("flow is invalid") and "'no_such_tool'" in reason


# -------------------------------------------------------------------- tool names


@pytest.mark.anyio
async def test_server_prefix_names_every_tool_prefix__flow() -> None:
    server = FlowServer(build_catalogue(), policy=ExposurePolicy(server_prefix="shop"))
    expected = sorted(f"shop__{name}" for name in EXPOSED)
    assert server.registered_tool_names == expected
    assert await listed_tool_names(server) == expected
    assert report_by_name(server)["order_status"].tool_name == "shop__order_status"
    async with Client(server.fastmcp) as client:
        # The bare flow name is not a published tool on a prefixed server.
        result = await client.call_tool("order_status", {"order_id": "A-1"},
                                        raise_on_error=False)
        assert result.is_error
        assert result.content[0].text == "Unknown tool: 'order_status'"


def test_a_published_name_too_long_for_mcp_is_a_construction_error() -> None:
    prefix = "p" * 50  # "p"*50 + "__" + "product_search" is 66 characters
    with pytest.raises(ExposureConfigError, match="not a valid MCP tool name"):
        FlowServer(build_catalogue(), policy=ExposurePolicy(server_prefix=prefix))
    # The same prefix is fine when only short names are published.
    executor = FlowExecutor(FlowRegistry())

    @tool(safety=ToolSafetyContract(SideEffectLevel.NONE))
    def ping(text: str) -> dict:
        return {"text": text}

    executor.register_tool(ping)
    executor.registry.register_flow(Flow("ping", "Ping.", [FlowStep("ping")]))
    server = FlowServer(executor, policy=ExposurePolicy(server_prefix=prefix))
    assert server.registered_tool_names == [f"{prefix}__ping"]


def test_a_prefix_with_invalid_characters_is_a_construction_error() -> None:
    with pytest.raises(ExposureConfigError, match="server_prefix"):
        FlowServer(build_catalogue(), policy=ExposurePolicy(server_prefix="my shop"))


def test_name_validity_is_checked_only_for_flows_that_publish() -> None:
    # An excluded flow publishes nothing, so its would-be name cannot be invalid.
    executor = build_catalogue()
    long_name = "w" * 60
    executor.registry.register_flow(Flow(long_name, "Writes.", [FlowStep("write_note")]))
    server = FlowServer(
        executor,
        policy=ExposurePolicy(server_prefix="shop", flow_names=["product_search", long_name]),
    )
    assert server.registered_tool_names == ["shop__product_search"]
    with pytest.raises(ExposureConfigError, match=long_name):
        FlowServer(
            executor,
            policy=ExposurePolicy(
                server_prefix="shop",
                allowed_side_effects=["read", "write"],
                flow_names=[long_name],
            ),
        )


# ---------------------------------------------------- schemas and prompts toggles


@pytest.mark.anyio
async def test_without_schemas_and_prompts_nothing_but_tools_is_listed() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=False, expose_prompts=False)
    async with Client(server.fastmcp) as client:
        assert sorted(t.name for t in await client.list_tools()) == sorted(EXPOSED)
        assert await client.list_resources() == []
        assert await client.list_resource_templates() == []
        assert await client.list_prompts() == []
    assert server.resource_uris == [] and server.prompt_names == []
    for entry in server.exposure_report():
        assert entry.resource_uris == () and entry.prompt_names == ()


@pytest.mark.anyio
async def test_report_names_the_published_resources_and_prompts_clients_see() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    async with Client(server.fastmcp) as client:
        uris = {str(r.uri) for r in await client.list_resources()}
        prompts = {p.name for p in await client.list_prompts()}
    by_name = report_by_name(server)
    search = by_name["product_search"]
    assert search.resource_uris == ("chainweaver://flows/product_search/schema",)
    assert set(search.prompt_names) == {"product_search", "product_search__compare",
                                        "product_search__brief"}
    for entry in server.exposure_report():
        assert set(entry.resource_uris) <= uris
        assert set(entry.prompt_names) <= prompts
        if not entry.exposed:
            # Nothing derived from an excluded flow is published anywhere.
            assert not any(entry.flow_name in uri for uri in uris)
            assert not any(name.startswith(entry.flow_name) for name in prompts)


def test_report_entries_serialise_to_plain_dicts() -> None:
    entry = report_by_name(FlowServer(build_catalogue()))["needs_approval"].to_dict()
    assert entry["flow_name"] == "needs_approval"
    assert entry["exposed"] is False
    assert entry["tool_name"] is None
    assert isinstance(entry["reason"], str) and entry["reason"]


def test_owner_filter_excludes_flows_without_an_owner() -> None:
    executor = build_catalogue()
    executor.registry.register_flow(Flow(
        "orphan_search", "Nobody owns this.", [FlowStep("search_products")],
        governance=FlowGovernance(owner=None),
    ))
    server = FlowServer(executor, policy=ExposurePolicy(owners=["search-team"]))
    assert "orphan_search" not in server.registered_tool_names
    assert "owner None" in report_by_name(server)["orphan_search"].reason


class _Opaque:
    """A plain class: pydantic can validate it but cannot describe it in JSON Schema."""


class _OpaqueInput(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    handle: _Opaque | None = None


@pytest.mark.anyio
async def test_flow_whose_schema_cannot_be_generated_is_excluded_not_fatal() -> None:
    executor = build_catalogue()
    executor.register_tool(Tool("opaque", "Takes an opaque handle.", _OpaqueInput, None,
                                lambda model: {}, safety=ToolSafetyContract("none")))
    executor.registry.register_flow(Flow("opaque_flow", "Opaque.", [FlowStep("opaque")]))
    # Even forcing it does not publish it: it could not be listed.
    server = FlowServer(
        executor,
        expose_schemas=True,
        expose_prompts=True,
        policy=ExposurePolicy(flow_names=["opaque_flow", "product_search"], force_expose=True),
    )
    entry = report_by_name(server)["opaque_flow"]
    assert not entry.exposed
    assert entry.reason.startswith("its input JSON Schema cannot be generated from "
                                   "_OpaqueInput: Cannot generate a JsonSchema")
    async with Client(server.fastmcp) as client:
        # The other flow is still listed in full: one bad model does not empty the list.
        assert [t.name for t in await client.list_tools()] == ["product_search"]
        assert "opaque_flow" not in {p.name for p in await client.list_prompts()}


def test_flow_cannot_take_the_guide_prompt_name() -> None:
    executor = build_catalogue()
    executor.registry.register_flow(Flow("chainweaver_guide", "Shadows the guide.",
                                         [FlowStep("search_products")]))
    with pytest.raises(ExposureConfigError, match="'chainweaver_guide' of flow "
                                                  "'chainweaver_guide' is reserved"):
        FlowServer(executor, expose_prompts=True)
    # Without prompts there is no clash; with a prefix the names differ.
    assert "chainweaver_guide" in FlowServer(executor).registered_tool_names
    prefixed = FlowServer(
        executor,
        expose_prompts=True,
        policy=ExposurePolicy(server_prefix="shop"),
    )
    assert "shop__chainweaver_guide" in prefixed.prompt_names
    assert "chainweaver_guide" in prefixed.prompt_names


class _NotANumber(BaseModel):
    ratio: float = float("nan")


@pytest.mark.anyio
async def test_flow_whose_schema_is_not_valid_json_is_excluded() -> None:
    executor = build_catalogue()
    executor.register_tool(Tool("nan_tool", "NaN default.", _NotANumber, None,
                                lambda model: {}, safety=ToolSafetyContract("none")))
    executor.registry.register_flow(Flow("nan_flow", "NaN.", [FlowStep("nan_tool")]))
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True)
    reason = report_by_name(server)["nan_flow"].reason
    assert reason.startswith("its input JSON Schema from _NotANumber is not valid JSON: "
                             "Out of range float values are not JSON compliant")
    async with Client(server.fastmcp) as client:
        assert sorted(t.name for t in await client.list_tools()) == sorted(EXPOSED)


@pytest.mark.parametrize("prefix", ["", "shop", "a__b"])
def test_lookups_judge_one_flow_and_agree_with_the_whole_catalogue(prefix: str) -> None:

    def fresh() -> Exposure:
        return Exposure(build_catalogue(), ExposurePolicy(server_prefix=prefix),
                        expose_schemas=True, expose_prompts=True)

    whole = fresh().catalogue
    names = [*whole.tools, *whole.prompts, *whole.resources]
    for flow in EXCLUDED_NAMES:  # the names an excluded flow would have been given
        tool = f"{prefix}__{flow}" if prefix else flow
        names += [tool, f"chainweaver://flows/{tool}/schema", f"{tool}__brief", f"{tool}__x"]
    names += ["", "__", "shop__", "chainweaver://flows//schema", "never", "never__brief"]
    for name in names:
        lookup = fresh()  # nothing decided yet: each answer judges only what it needs
        assert lookup.tool(name) == whole.tools.get(name), name
        assert lookup.resource(name) == whole.resources.get(name), name
        assert lookup.prompt(name) == whole.prompts.get(name), name


@pytest.mark.anyio
async def test_a_server_follows_registrations_made_after_it_was_built() -> None:
    executor = build_catalogue()
    server = FlowServer(executor)
    before = executor.registry.state()
    # Registered after construction: the server follows the registry.
    executor.register_tool(late_lookup)
    executor.registry.register_flow(Flow("late_flow", "Registered late.",
                                         [FlowStep("late_lookup")]))
    executor.registry.register_flow(Flow("order_status", "A newer version.",
                                         [FlowStep("late_lookup")], version="9.0.0"))
    async with Client(server.fastmcp) as client:
        # A lookup first (nothing decided yet), then the list: they agree.
        called = await client.session.call_tool("late_flow", {"text": "x"})
        listed = {tool.name: tool for tool in await client.list_tools()}
        status = await client.call_tool("order_status", {"text": "A-1"})
    assert not called.is_error and called.content[0].text == '{"text": "x"}'
    assert "late_flow" in listed
    assert listed["order_status"].meta["chainweaver"]["version"] == "9.0.0"
    assert status.content[0].text == '{"text": "A-1"}'
    assert [e.flow_name for e in server.exposure_report()].count("late_flow") == 1
    # A snapshot of the registry before the changes still answers as it stood then.
    old = Exposure(executor, ExposurePolicy(), state=before)
    assert old.tool("late_flow") is None
    assert old.tool("order_status").flow.version == "2.1.0"


@tool(safety=ToolSafetyContract("read"))
def late_lookup(text: str) -> dict:
    """A tool registered after the server was built."""
    return {"text": text}
