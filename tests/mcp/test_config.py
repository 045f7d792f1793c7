"""Every FlowServer setting is checked at construction; the simple call stays simple.

A bad value raises ``ExposureConfigError`` naming the setting, before any request.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from support.catalogue import build_catalogue

import chainweaver
from chainweaver import ExposureConfigError, FlowPrompt, PromptMessage
from chainweaver.mcp import (
    AuditHook,
    Authenticator,
    Authorizer,
    Discovery,
    ErrorDetail,
    ExposurePolicy,
    FixedWindowRateLimiter,
    FlowServer,
    RateLimiter,
    SecurityConfig,
    ServingConfig,
)

NOT_SECONDS = ["5", 0, -1, float("nan"), float("inf"), True, None, [1]]
NOT_POSITIVE_INT = [0, -3, "10", 2.5, True, False, float("nan")]
NOT_BOOL = [1, 0, "yes", None, "True"]


def bad_values() -> list[tuple[str, Any, Any]]:
    """(setting, how to build it with a bad value, bad value)."""
    cases: list[tuple[str, Any, Any]] = []
    for value in NOT_SECONDS:
        if value is not None:
            cases.append(("flow_timeout", lambda v: ServingConfig(flow_timeout=v), value))
        cases.append(("hook_timeout", lambda v: SecurityConfig(hook_timeout=v), value))
    for value in NOT_POSITIVE_INT:
        cases.append(("page_size", lambda v: ServingConfig(page_size=v), value))
    for value in NOT_BOOL:
        cases.append(("force_expose", lambda v: ExposurePolicy(force_expose=v), value))
        cases.append(("run_notifications",
                      lambda v: ServingConfig(run_notifications=v), value))
        cases.append(("allow_requires_approval",
                      lambda v: ExposurePolicy(allow_requires_approval=v), value))
        cases.append(("expose_schemas",
                      lambda v: FlowServer(build_catalogue(), expose_schemas=v), value))
        cases.append(("expose_prompts",
                      lambda v: FlowServer(build_catalogue(), expose_prompts=v), value))
    for value in ["verbose", None, 1, "FULL"]:
        cases.append(("error_detail", lambda v: SecurityConfig(error_detail=v), value))
    for value in ["order_status", b"x", 5, [1]]:
        cases.append(("flow_names", lambda v: ExposurePolicy(flow_names=v), value))
        cases.append(("owners", lambda v: ExposurePolicy(owners=v), value))
    for value in ["live", ["live"], 3]:
        cases.append(("allowed_lifecycles", lambda v: ExposurePolicy(allowed_lifecycles=v),
                      value))
        cases.append(("allowed_side_effects",
                      lambda v: ExposurePolicy(allowed_side_effects=v), value))
    for value in ["bad prefix", "ok\n", "a/b", 7, "x" * 65]:
        cases.append(("server_prefix", lambda v: ExposurePolicy(server_prefix=v), value))
    for setting in ("authenticator", "authorizer", "audit_hook"):
        cases.append((setting, lambda v, s=setting: SecurityConfig(**{s: v}), "not callable"))
    cases.append(("rate_limiter", lambda v: SecurityConfig(rate_limiter=v), object()))
    for value in [0, -1, True, "100", 2.5, None]:
        cases.append(("max_listen_streams_per_caller",
                      lambda v: SecurityConfig(max_listen_streams_per_caller=v), value))
        cases.append(("max_listen_streams", lambda v: SecurityConfig(max_listen_streams=v),
                      value))
    for setting in ("policy", "security", "serving"):
        cases.append((setting, lambda v, s=setting: FlowServer(build_catalogue(), **{s: v}),
                      {"flow_timeout": 1}))
    for value in ["", "  ", 5, None]:
        cases.append(("name", lambda v: FlowServer(build_catalogue(),
                                                   serving=ServingConfig(name=v)), value))
    for value in ["", 5]:
        cases.append(("version", lambda v: FlowServer(build_catalogue(),
                                                      serving=ServingConfig(version=v)), value))
    cases.append(("instructions", lambda v: FlowServer(build_catalogue(),
                                                       serving=ServingConfig(instructions=v)), 5))
    for value in ["no-slash", "a/b/c", "", "io.github.me/", 5]:
        cases.append(("registry_name", lambda v: Discovery(registry_name=v), value))
    for value in [-1, float("nan"), float("inf"), "30", True, None]:
        cases.append(("cache_ttl", lambda v: Discovery(cache_ttl=v), value))
    cases.append(("discovery", lambda v: FlowServer(build_catalogue(), discovery=v),
                  {"cache_ttl": 1}))
    cases.append(("prompts", lambda v: FlowServer(build_catalogue(), expose_prompts=True,
                                                  prompts=v), "a prompt"))
    cases.append(("executor", lambda v: FlowServer(v), "an executor"))
    return cases


@pytest.mark.parametrize(("setting", "build", "value"), bad_values(),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_a_bad_setting_fails_at_construction_naming_it(setting: str, build: Any,
                                                       value: Any) -> None:
    with pytest.raises(ExposureConfigError, match=setting):
        build(value)


def test_force_expose_needs_flow_names() -> None:
    with pytest.raises(ExposureConfigError, match="force_expose=True needs flow_names"):
        ExposurePolicy(force_expose=True)


def test_server_prompts_need_expose_prompts() -> None:
    prompt = FlowPrompt("hello", messages=[PromptMessage("user", "Hi.")])
    with pytest.raises(ExposureConfigError, match="expose_prompts=True"):
        FlowServer(build_catalogue(), prompts=[prompt])


def test_settings_are_normalised_values() -> None:
    policy = ExposurePolicy(flow_names=["a", "b", "a"], allowed_lifecycles=["active", "draft"],
                            allowed_side_effects=["read"])
    assert policy.flow_names == frozenset({"a", "b"})
    assert {x.value for x in policy.allowed_lifecycles} == {"active", "draft"}
    assert ServingConfig(flow_timeout=2).flow_timeout == 2.0
    assert type(Discovery(cache_ttl=30).cache_ttl) is float
    assert SecurityConfig().active is False
    assert SecurityConfig(audit_hook=print).active is True


def test_the_hook_types_and_settings_are_exported() -> None:
    # Typed hooks for authors of authenticators, authorizers, audit sinks and limiters.
    limiter: RateLimiter = FixedWindowRateLimiter(5)
    detail: ErrorDetail = "type_only"
    hooks: tuple[Any, ...] = (Authenticator, Authorizer, AuditHook, RateLimiter)
    assert all(hooks) and limiter.acquire is not None and detail == "type_only"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_server_info_names_chainweaver_and_its_version(mode: str) -> None:
    default = FlowServer(build_catalogue())
    named = FlowServer(build_catalogue(), serving=ServingConfig(name="bookshop", version="2.3.1"))
    async with Client(default.fastmcp, mode=mode) as client:
        info = client.server_info if mode == "auto" else client.initialize_result.server_info
        assert (info.name, info.version) == ("chainweaver", chainweaver.__version__)
    async with Client(named.fastmcp, mode=mode) as client:
        info = client.server_info if mode == "auto" else client.initialize_result.server_info
        assert (info.name, info.version) == ("bookshop", "2.3.1")
