"""FlowServer's constructor: the simple call stays simple, everything else lives in four
configuration objects, and the keywords that moved there keep working for one release
with a DeprecationWarning that says where each one lives now."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.server.auth import StaticTokenVerifier
from support.catalogue import build_catalogue

from chainweaver import ExposureConfigError
from chainweaver.mcp import (
    CallerIdentity,
    ExposurePolicy,
    FlowServer,
    SecurityConfig,
    ServingConfig,
    TaskSettings,
    visible_claim,
)

MODES = ["auto", "legacy"]


def olga(ctx: Any) -> CallerIdentity:
    return CallerIdentity("olga", {"teams": ["orders-team"]})


def test_the_constructor_takes_eight_keywords_at_most() -> None:
    parameters = inspect.signature(FlowServer).parameters
    keywords = [name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert keywords == ["expose_schemas", "expose_prompts", "prompts", "policy",
                        "security", "serving", "tasks"]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_every_setting_through_the_configuration_objects(mode: str) -> None:
    server = FlowServer(
        build_catalogue(), expose_schemas=True, expose_prompts=True,
        policy=ExposurePolicy(approval="elicit"),
        security=SecurityConfig(authenticator=olga, visible=visible_claim("teams")),
        serving=ServingConfig(name="shop", version="9.9.9", instructions="Ask nicely.",
                              approval_timeout=12, resources_as_tools=True))
    async with Client(server.fastmcp, mode=mode) as client:
        tools = {tool.name for tool in await client.list_tools()}
        info = client.initialize_result.server_info if mode == "legacy" \
            else client.server_info
    assert {"order_status", "list_resources", "read_resource"} <= tools
    assert "product_search" not in tools  # another team's flow: outside olga's view
    assert (info.name, info.version) == ("shop", "9.9.9")
    assert server.policy.approval == "elicit" and server.serving.approval_timeout == 12


@pytest.mark.tasks
def test_tasks_take_a_url_or_task_settings() -> None:
    by_url = FlowServer(build_catalogue(), tasks="memory://")
    by_settings = FlowServer(build_catalogue(),
                             tasks=TaskSettings(url="memory://", mode="forbidden"))
    assert by_url.policy.task_mode == "optional"
    assert by_settings.policy.task_mode == "forbidden"


MOVED: list[tuple[str, Any, str, Any]] = [
    ("name", "shop", "ServingConfig(name=...)", lambda s: s.serving.name == "shop"),
    ("version", "1.2.3", "ServingConfig(version=...)", lambda s: s.serving.version == "1.2.3"),
    ("instructions", "Hi.", "ServingConfig(instructions=...)",
     lambda s: s.serving.instructions == "Hi."),
    ("approval_timeout", 7, "ServingConfig(approval_timeout=...)",
     lambda s: s.serving.approval_timeout == 7),
    ("approval", "elicit", "ExposurePolicy(approval=...)",
     lambda s: s.policy.approval == "elicit"),
    ("visible", visible_claim("teams"), "SecurityConfig(visible=...)",
     lambda s: s.security.visible is not None),
    ("auth", StaticTokenVerifier({"t": {"client_id": "c", "scopes": []}}),
     "SecurityConfig(auth=...)", lambda s: s.security.auth is not None),
    pytest.param("task_mode", "required", "TaskSettings(url=..., mode=...)",
                 lambda s: s.policy.task_mode == "required", marks=pytest.mark.tasks,
                 id="task_mode"),
    pytest.param("task_settings", TaskSettings(concurrency=2), "tasks=TaskSettings(...)",
                 lambda s: s._tasks_url == "memory://", marks=pytest.mark.tasks,
                 id="task_settings"),
]


@pytest.mark.parametrize(("keyword", "value", "now", "applied"), MOVED,
                         ids=[m[0] if isinstance(m[0], str) else None for m in MOVED])
def test_a_moved_keyword_warns_where_it_lives_now_and_still_applies(
        keyword: str, value: Any, now: str, applied: Any) -> None:
    options: dict[str, Any] = {keyword: value}
    if keyword.startswith("task"):
        options["tasks"] = "memory://"
    with pytest.warns(DeprecationWarning, match=rf"FlowServer\({keyword}=\.\.\.\) is "
                                               rf"deprecated .*{now.split('(')[0]}"):
        server = FlowServer(build_catalogue(), **options)
    assert applied(server)


@pytest.mark.parametrize("keyword", ["resources_as_tools", "prompts_as_tools"])
def test_the_tool_forms_moved_to_serving(keyword: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"ServingConfig"):
        server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                            **{keyword: True})
    assert getattr(server.serving, keyword) is True


def test_an_unknown_keyword_is_a_type_error_and_auth_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument.*flavour"):
        FlowServer(build_catalogue(), flavour="vanilla")
    verifier = StaticTokenVerifier({"t": {"client_id": "c", "scopes": []}})
    with pytest.warns(DeprecationWarning), pytest.raises(ExposureConfigError,
                                                         match="auth is set twice"):
        FlowServer(build_catalogue(), auth=verifier, security=SecurityConfig(auth=verifier))


@pytest.mark.parametrize(("options", "message"), [
    (lambda: {"tasks": 5}, "tasks must be None or a URL"),
    (lambda: {"tasks": TaskSettings(url="ftp://x")}, "tasks must be None or a URL"),
    (lambda: {"serving": ServingConfig(name="")}, "name"),
    (lambda: {"serving": ServingConfig(approval_timeout=-1)}, "approval_timeout"),
    (lambda: {"serving": ServingConfig(resources_as_tools=True)}, "resources_as_tools needs"),
])
def test_bad_settings_fail_at_construction(options: Any, message: str) -> None:
    with pytest.raises(ExposureConfigError, match=message):
        FlowServer(build_catalogue(), **options())
