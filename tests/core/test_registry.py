"""FlowRegistry: registration, lookup by name and version, listings, errors."""

from __future__ import annotations

import pytest

from chainweaver import (
    ChainWeaverError,
    DuplicateFlowError,
    Flow,
    FlowNotFoundError,
    FlowRegistry,
    FlowStep,
    FlowVersionNotFoundError,
    InvalidVersionError,
)


def make(name: str, version: str) -> Flow:
    return Flow(name, f"{name} {version}", [FlowStep("t")], version=version)


@pytest.fixture
def registry() -> FlowRegistry:
    registry = FlowRegistry()
    for name, version in [("beta", "1.9.0"), ("alpha", "2.0.0"), ("beta", "1.10.0"),
                          ("beta", "1.0")]:
        registry.register_flow(make(name, version))
    return registry


def test_register_returns_the_flow() -> None:
    registry = FlowRegistry()
    flow = make("f", "1.0.0")
    assert registry.register_flow(flow) is flow
    assert "f" in registry and "g" not in registry and 3 not in registry
    assert len(registry) == 1


def test_register_rejects_non_flows() -> None:
    with pytest.raises(TypeError, match="Flow"):
        FlowRegistry().register_flow({"name": "f"})  # type: ignore[arg-type]


def test_duplicate_name_and_version(registry: FlowRegistry) -> None:
    with pytest.raises(DuplicateFlowError, match="'beta' version '1.0.0'"):
        registry.register_flow(make("beta", "1.0.0"))  # 1.0.0 == 1.0
    with pytest.raises(DuplicateFlowError):
        registry.register_flow(make("beta", "1.10.0"))
    assert registry.versions("beta") == ["1.0", "1.9.0", "1.10.0"]
    # the same version under another name is fine
    registry.register_flow(make("gamma", "1.10.0"))


def test_get_flow_latest_by_default(registry: FlowRegistry) -> None:
    assert registry.get_flow("beta").version == "1.10.0"
    assert registry.get_flow("alpha").version == "2.0.0"


def test_get_flow_by_version_compares_as_versions(registry: FlowRegistry) -> None:
    assert registry.get_flow("beta", "1.9.0").description == "beta 1.9.0"
    assert registry.get_flow("beta", "1.0.0").version == "1.0"
    assert registry.get_flow("beta", "1").version == "1.0"


def test_unknown_flow(registry: FlowRegistry) -> None:
    with pytest.raises(FlowNotFoundError, match="'nope'"):
        registry.get_flow("nope")
    with pytest.raises(FlowNotFoundError):
        registry.versions("nope")


def test_unknown_version_names_the_registered_ones(registry: FlowRegistry) -> None:
    with pytest.raises(FlowVersionNotFoundError, match=r"registered: 1\.0, 1\.9\.0, 1\.10\.0"):
        registry.get_flow("beta", "3.0.0")


def test_invalid_version_in_lookup(registry: FlowRegistry) -> None:
    with pytest.raises(InvalidVersionError):
        registry.get_flow("beta", "newest")


def test_listings(registry: FlowRegistry) -> None:
    assert [(f.name, f.version) for f in registry.list_flows()] == [
        ("alpha", "2.0.0"), ("beta", "1.0"), ("beta", "1.9.0"), ("beta", "1.10.0")
    ]
    assert registry.flow_names() == ["alpha", "beta"]
    assert registry.versions("beta") == ["1.0", "1.9.0", "1.10.0"]
    assert len(registry) == 2


def test_empty_registry() -> None:
    registry = FlowRegistry()
    assert registry.list_flows() == []
    assert registry.flow_names() == []
    assert len(registry) == 0


def test_exception_hierarchy() -> None:
    assert issubclass(FlowVersionNotFoundError, FlowNotFoundError)
    for error in (DuplicateFlowError, FlowNotFoundError, InvalidVersionError):
        assert issubclass(error, ChainWeaverError)
    assert issubclass(FlowNotFoundError, LookupError)
    assert issubclass(InvalidVersionError, ValueError)


def test_the_registry_can_be_read_as_it_stood_at_an_earlier_registration() -> None:
    registry = FlowRegistry()
    first = registry.register_flow(Flow("a", "A.", [FlowStep("t")], version="1.0.0"))
    then = registry.state()
    registry.register_flow(Flow("a", "A.", [FlowStep("t")], version="2.0.0"))
    registry.register_flow(Flow("b", "B.", [FlowStep("t")], version="0.5.0"))
    # An older version registered later is not visible at the earlier point either.
    registry.register_flow(Flow("a", "A.", [FlowStep("t")], version="0.1.0"))
    assert registry.sequence == then.sequence + 3
    assert then.latest("a") is first
    assert then.latest("b") is None
    assert then.names() == ["a"]
    assert registry.state().names() == ["a", "b"]
    assert registry.state().latest("a").version == "2.0.0"
