"""FlowServer's constructor: the simple call stays simple, everything else lives in four
configuration objects or is a whole feature's keyword, and the spellings that moved keep
working for one release with a DeprecationWarning that says where each one lives now."""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.server.auth import StaticTokenVerifier
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.catalogue import build_catalogue

from chainweaver import ExposureConfigError
from chainweaver.mcp import (
    CallerIdentity,
    ExposurePolicy,
    FlowServer,
    RunHistory,
    SecurityConfig,
    ServingConfig,
    TaskSettings,
    visible_claim,
)

MODES = ["auto", "legacy"]


def olga(ctx: Any) -> CallerIdentity:
    return CallerIdentity("olga", {"teams": ["orders-team"]})


def test_the_constructor_takes_eleven_keywords_at_most() -> None:
    parameters = inspect.signature(FlowServer).parameters
    keywords = [name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert keywords == ["expose_schemas", "expose_prompts", "prompts", "policy",
                        "security", "serving", "tasks", "run_history", "governance",
                        "discovery", "meter_provider"]


def test_serving_config_keeps_serving_mechanics_and_identity_only() -> None:
    # dataclasses.fields leaves out the InitVars (the deprecated settings that moved).
    fields = [field.name for field in dataclasses.fields(ServingConfig)]
    assert len(fields) <= 11  # issue 33: a new concern gets its own settings object
    assert fields == ["flow_timeout", "page_size", "freeze_gc", "change_debounce",
                      "run_notifications", "name", "version", "instructions",
                      "approval_timeout", "resources_as_tools", "prompts_as_tools"]


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


@pytest.mark.tasks
@pytest.mark.parametrize(("options", "message"), [
    ({"task_mode": "sometimes"}, "task_mode must be one of"),
    ({"tasks": None, "task_settings": TaskSettings()}, "task_settings needs tasks="),
    ({"task_settings": "fast"}, "task_settings must be a TaskSettings"),
])
def test_a_moved_task_keyword_is_still_checked(options: dict[str, Any], message: str) -> None:
    settings = {"tasks": "memory://", **options}
    with pytest.warns(DeprecationWarning), pytest.raises(ExposureConfigError, match=message):
        FlowServer(build_catalogue(), **settings)


@pytest.mark.parametrize("keyword, hint", [
    ("server_prefix", "server_prefix is a setting of ExposurePolicy: "
                      "FlowServer(executor, policy=ExposurePolicy(server_prefix=...))"),
    ("error_detail", "error_detail is a setting of SecurityConfig: "
                     "FlowServer(executor, security=SecurityConfig(error_detail=...))"),
    ("flow_timeout", "flow_timeout is a setting of ServingConfig: "
                     "FlowServer(executor, serving=ServingConfig(flow_timeout=...))"),
    ("concurrency", "concurrency is a setting of TaskSettings: "
                    "FlowServer(executor, tasks=TaskSettings(concurrency=...))"),
])
def test_an_unknown_keyword_that_is_a_setting_says_where_it_lives(keyword: str,
                                                                  hint: str) -> None:
    with pytest.raises(TypeError) as caught:
        FlowServer(build_catalogue(), **{keyword: 1})
    assert str(caught.value) == (f"FlowServer() got unexpected keyword argument(s): "
                                 f"{keyword} ({hint})")


def test_an_unknown_keyword_is_a_type_error_and_auth_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument.*flavour"):
        FlowServer(build_catalogue(), flavour="vanilla")
    verifier = StaticTokenVerifier({"t": {"client_id": "c", "scopes": []}})
    with pytest.warns(DeprecationWarning), pytest.raises(ExposureConfigError,
                                                         match="auth is set twice"):
        FlowServer(build_catalogue(), auth=verifier, security=SecurityConfig(auth=verifier))


KEY = "k" * 32


def recorded_metrics() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


# ServingConfig settings that moved: (setting, value, where it lives now, applied?)
MOVED_SETTINGS: list[Any] = [
    ("allowed_hosts", ["mcp.example.com"], r"SecurityConfig\(allowed_hosts",
     lambda s: s.security.allowed_hosts == ("mcp.example.com",)),
    ("allowed_origins", ["https://app.example.com"], r"SecurityConfig\(allowed_origins",
     lambda s: s.security.allowed_origins == ("https://app.example.com",)),
    ("max_body_bytes", 1024, r"SecurityConfig\(max_body_bytes",
     lambda s: s.security.max_body_bytes == 1024 and s._gate.serving.body_limit == 1024),
    ("request_state_keys", [KEY], r"SecurityConfig\(request_state_keys",
     lambda s: s.security.request_state_keys == (KEY.encode(),)),
    ("run_history", RunHistory(), r"FlowServer\(run_history",
     lambda s: s.run_store is not None),
    pytest.param("governance", "redis://127.0.0.1:9/0", r"FlowServer\(governance",
                 lambda s: s._shared is not None, marks=pytest.mark.tasks, id="governance"),
]


@pytest.mark.parametrize(("setting", "value", "now", "applied"), MOVED_SETTINGS,
                         ids=[m[0] if isinstance(m, tuple) else None for m in MOVED_SETTINGS])
def test_a_moved_serving_setting_warns_where_it_lives_now_and_still_applies(
        setting: str, value: Any, now: str, applied: Any) -> None:
    with pytest.warns(DeprecationWarning, match=rf"ServingConfig\({setting}=\.\.\.\) is "
                                               rf"deprecated .*use .*{now}"):
        serving = ServingConfig(**{setting: value})
    server = FlowServer(build_catalogue(), serving=serving)
    assert applied(server)


@pytest.mark.anyio
async def test_a_meter_provider_given_to_serving_config_still_counts() -> None:
    provider, reader = recorded_metrics()
    with pytest.warns(DeprecationWarning, match=r"use FlowServer\(meter_provider=\.\.\.\)"):
        serving = ServingConfig(meter_provider=provider)
    server = FlowServer(build_catalogue(), serving=serving)
    async with Client(server.fastmcp) as client:
        await client.list_tools()
    names = {metric.name for resource in reader.get_metrics_data().resource_metrics
             for scope in resource.scope_metrics for metric in scope.metrics}
    assert "chainweaver.requests" in names


@pytest.mark.anyio
async def test_the_feature_keywords_apply() -> None:
    provider, reader = recorded_metrics()
    server = FlowServer(build_catalogue(), run_history=RunHistory(), meter_provider=provider,
                        security=SecurityConfig(max_body_bytes=2048,
                                                allowed_hosts=["mcp.example.com"]))
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("order_status", {"order_id": "A-1"})
    assert server.run_store is not None
    assert await server.run_store.get(result.meta["chainweaver"]["run_id"]) is not None
    assert reader.get_metrics_data() is not None
    assert server._gate.serving.body_limit == 2048
    assert server.security.allowed_hosts == ("mcp.example.com",)


def test_a_setting_given_in_its_old_and_its_new_place_is_refused() -> None:
    with pytest.warns(DeprecationWarning):
        old = ServingConfig(run_history=RunHistory(), allowed_hosts=["a.example"])
    with pytest.raises(ExposureConfigError, match="run_history is set twice"):
        FlowServer(build_catalogue(), serving=old, run_history=RunHistory())
    with pytest.raises(ExposureConfigError, match="allowed_hosts is set twice"):
        FlowServer(build_catalogue(), serving=old,
                   security=SecurityConfig(allowed_hosts=["b.example"]))


def test_a_moved_setting_is_checked_where_it_was_given() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ExposureConfigError,
                                                         match="allowed_hosts takes a list"):
        ServingConfig(allowed_hosts="mcp.example.com")
    with pytest.warns(DeprecationWarning), pytest.raises(ExposureConfigError,
                                                         match="run_history must be"):
        ServingConfig(run_history="memory://")


@pytest.mark.parametrize(("options", "message"), [
    (lambda: {"run_history": "memory://"}, "run_history must be None or a RunHistory"),
    (lambda: {"governance": "ftp://x"}, "governance"),
    (lambda: {"meter_provider": object()}, "meter_provider must be an OpenTelemetry"),
    (lambda: {"security": SecurityConfig(max_body_bytes=0)}, "max_body_bytes"),
    (lambda: {"security": SecurityConfig(request_state_keys=["short"])},
     "request_state_keys must list secrets"),
    (lambda: {"tasks": 5}, "tasks must be None or a URL"),
    (lambda: {"tasks": TaskSettings(url="ftp://x")}, "tasks must be None or a URL"),
    (lambda: {"serving": ServingConfig(name="")}, "name"),
    (lambda: {"serving": ServingConfig(approval_timeout=-1)}, "approval_timeout"),
    (lambda: {"serving": ServingConfig(resources_as_tools=True)}, "resources_as_tools needs"),
])
def test_bad_settings_fail_at_construction(options: Any, message: str) -> None:
    with pytest.raises(ExposureConfigError, match=message):
        FlowServer(build_catalogue(), **options())


def test_a_moved_setting_still_reads_back_and_survives_replace() -> None:
    history = RunHistory()
    with pytest.warns(DeprecationWarning):
        old = ServingConfig(max_body_bytes=1024, run_history=history)
    assert (old.max_body_bytes, old.run_history, old.allowed_hosts) == (1024, history, None)
    with pytest.warns(DeprecationWarning):  # the old spelling, given again by replace
        copy = dataclasses.replace(old, page_size=5)
    assert (copy.page_size, copy.max_body_bytes, copy.run_history) == (5, 1024, history)
    # Left out, they read as their old defaults, and replace warns of nothing.
    plain = ServingConfig()
    assert plain.max_body_bytes == 16 * 2**20 and plain.governance is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dataclasses.replace(plain, page_size=5).moved == {}
