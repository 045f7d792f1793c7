"""The prompt policy: which prompt kinds a server publishes, narrowed by flow, on both
protocol eras; withheld prompts answer like names that never existed, tools and
resources are untouched, and the exposure report says why each is withheld."""

from __future__ import annotations

import pytest
from fastmcp import Client
from support.catalogue import build_catalogue
from support.views import NEVER, answer, renamed

from chainweaver import FlowPrompt, PromptMessage
from chainweaver.errors import ExposureConfigError
from chainweaver.mcp import ExposurePolicy, FlowServer, PromptPolicy

MODES = ["auto", "legacy"]
OPERATOR = FlowPrompt("operator_note", description="The operator's prompt.",
                      messages=[PromptMessage("user", "Be brief.")])


def served(**prompts: object) -> FlowServer:
    return FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                      prompts=[OPERATOR],
                      policy=ExposurePolicy(prompts=PromptPolicy(**prompts)))  # type: ignore[arg-type]


async def _surface(client: Client) -> tuple[set[str], set[str], set[str]]:
    tools = {t.name for t in await client.list_tools()}
    resources = {str(r.uri) for r in await client.list_resources()}
    prompts = {p.name for p in await client.list_prompts()}
    return tools, resources, prompts


async def _get(client: Client, name: str) -> dict[str, object]:
    return await answer(lambda: client.session.get_prompt(name, {"query": "q"}))


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kinds, flows, kept", [
    (["authored"], None, {"product_search__compare", "product_search__brief"}),
    (["invocation", "guide"], None, {"product_search", "order_status", "price_quote",
                                     "failing_flow", "chainweaver_guide"}),
    (["server"], None, {"operator_note"}),
    (None, ["order_status"], {"order_status", "chainweaver_guide", "operator_note"}),
    ([], None, set()),
])
async def test_only_the_chosen_prompts_are_published_and_the_rest_never_existed(
        mode: str, kinds: list[str] | None, flows: list[str] | None, kept: set[str]) -> None:
    everything = served()
    narrowed = served(kinds=kinds, flow_names=flows)
    async with Client(everything.fastmcp, mode=mode) as full, \
            Client(narrowed.fastmcp, mode=mode) as client:
        all_tools, all_resources, all_prompts = await _surface(full)
        tools, resources, prompts = await _surface(client)
        assert (tools, resources) == (all_tools, all_resources)  # untouched
        assert prompts == kept & all_prompts
        never = await _get(client, NEVER)
        for name in all_prompts - prompts:
            # A withheld prompt: same error, byte for byte, as a name never published.
            assert renamed(await _get(client, name), name, NEVER) == never, name
            assert renamed(await answer(lambda n=name: client.session.complete(
                {"type": "ref/prompt", "name": n}, {"name": "query", "value": ""})),
                name, NEVER) == renamed(await answer(lambda: client.session.complete(
                    {"type": "ref/prompt", "name": NEVER}, {"name": "query", "value": ""})),
                    NEVER, NEVER)
        for name in prompts - {"chainweaver_guide", "operator_note"}:
            assert renamed(await _get(client, name), name, NEVER) != never, name
    assert sorted(narrowed.prompt_names) == sorted(prompts)


def test_the_report_says_which_prompts_each_flow_publishes_and_why_not_the_others() -> None:
    server = served(kinds=["invocation", "authored"], flow_names=["order_status"])
    report = {entry.flow_name: entry for entry in server.exposure_report()}
    assert report["order_status"].prompt_names == ("order_status",)
    assert report["order_status"].withheld_prompts == ()
    search = report["product_search"]
    assert search.prompt_names == ()
    assert dict(search.withheld_prompts) == dict.fromkeys(
        ("product_search", "product_search__brief", "product_search__compare"),
        "flow not listed in the prompt policy's flow_names")
    only_authored = served(kinds=["authored"])
    entry = next(e for e in only_authored.exposure_report() if e.flow_name == "product_search")
    assert entry.to_dict()["withheld_prompts"] == {
        "product_search": "invocation prompts are not published (prompt kinds: authored)"}
    assert "chainweaver_guide" not in only_authored.prompt_names


@pytest.mark.parametrize("settings, message", [
    ({"kinds": ["toolset"]}, "unknown kind"),
    ({"kinds": "guide"}, "takes a list"),
    ({"flow_names": [3]}, "takes names"),
])
def test_a_bad_prompt_policy_fails_when_it_is_built(settings: dict[str, object],
                                                    message: str) -> None:
    with pytest.raises(ExposureConfigError, match=message):
        PromptPolicy(**settings)  # type: ignore[arg-type]


def test_prompt_flow_names_must_be_registered() -> None:
    with pytest.raises(ExposureConfigError, match="prompts.flow_names names unregistered"):
        served(flow_names=["nope"])
