"""A flow's own ``governance.publish=False``: no policy publishes it (force_expose
included), every primitive answers for it exactly like a name that never existed, on
both protocol eras, and the exposure report says why, in its own words."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastmcp import Client
from support.catalogue import build_catalogue
from support.catalogue import opted_out_catalogue as opted_out
from support.views import NEVER, OWNERS, answers_for, assert_view, renamed

from chainweaver import FlowGovernance, load_flows
from chainweaver.errors import DefinitionError, FlowFileError
from chainweaver.mcp import ExposurePolicy, FlowServer
from chainweaver.mcp.publish.decision import OPTED_OUT

MODES = ["auto", "legacy"]




FORCED = ExposurePolicy(flow_names=list(OWNERS), force_expose=True,
                        allowed_side_effects=["none", "read", "write", "external",
                                              "destructive"],
                        allow_requires_approval=True)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", [None, FORCED], ids=["default", "force_expose"])
async def test_an_opted_out_flow_is_a_name_that_never_existed_in_every_primitive(
        mode: str, policy: ExposurePolicy | None) -> None:
    server = FlowServer(opted_out(), expose_schemas=True, expose_prompts=True, policy=policy)
    async with Client(server.fastmcp, mode=mode) as client:
        # Lists, the index, the guide, completions; calls, reads and renders of it
        # (tool, schema, invocation and authored prompts) answer byte for byte like
        # NEVER's, and its neighbours' do not.
        await assert_view(client, set(OWNERS) - {"product_search"})
    assert "product_search" not in server.registered_tool_names
    assert not any(name.startswith("product_search") for name in server.prompt_names)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_opting_out_hides_exactly_what_the_published_version_showed(mode: str) -> None:
    published = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    hidden = FlowServer(opted_out(), expose_schemas=True, expose_prompts=True)
    async with Client(published.fastmcp, mode=mode) as before, \
            Client(hidden.fastmcp, mode=mode) as after:
        shown = await answers_for(before, "product_search")
        gone = await answers_for(after, "product_search")
        never = await answers_for(after, NEVER)
    assert renamed(gone, "product_search", NEVER) == never
    assert renamed(shown, "product_search", NEVER) != never


def test_the_report_gives_the_opt_out_its_own_reason_before_every_policy_reason() -> None:
    server = FlowServer(opted_out(), policy=FORCED)
    entry = next(e for e in server.exposure_report() if e.flow_name == "product_search")
    assert (entry.exposed, entry.version, entry.reason, entry.forced) == \
        (False, "9.0.0", OPTED_OUT, False)
    assert entry.to_dict()["reason"] == OPTED_OUT
    # Listed nowhere else either: not in flow_names, and still its own reason.
    narrow = FlowServer(opted_out(), policy=ExposurePolicy(flow_names=["order_status"]))
    entry = next(e for e in narrow.exposure_report() if e.flow_name == "product_search")
    assert entry.reason == OPTED_OUT


def test_publish_must_be_a_bool() -> None:
    with pytest.raises(DefinitionError, match="publish must be True or False"):
        FlowGovernance(publish="no")  # type: ignore[arg-type]
    assert FlowGovernance().publish is True


def _flow_file(tmp_path: Path, governance: str) -> Path:
    path = tmp_path / "hidden.flow.yaml"
    lines = "".join(f"  {line}\n" for line in governance.splitlines())
    path.write_text("name: hidden_search\ndescription: Search, never published.\n"
                    f"governance:\n{lines}steps: [search_products]\n", encoding="utf-8")
    return path


def test_flow_files_carry_the_opt_out(tmp_path: Path) -> None:
    flows = load_flows(_flow_file(tmp_path, "publish: false\nowner: search-team"))
    assert flows[0].governance == FlowGovernance(owner="search-team", publish=False)
    with pytest.raises(FlowFileError, match="governance.publish"):
        load_flows(_flow_file(tmp_path, "publish: 'no'"))
    executor = build_catalogue()
    executor.registry.register_flow(flows[0])
    server = FlowServer(executor, policy=ExposurePolicy(flow_names=["hidden_search"],
                                                        force_expose=True))
    assert server.registered_tool_names == []
    report = {entry.flow_name: entry for entry in server.exposure_report()}
    assert report["hidden_search"].reason == OPTED_OUT


def test_the_flow_file_schema_documents_the_field() -> None:
    from chainweaver.flow_format import flow_file_schema

    schema = flow_file_schema()
    governance = schema["$defs"]["GovernanceFormat"]["properties"]["publish"]
    assert governance["type"] == "boolean" and governance["default"] is True
