"""FlowRegistry: registration, lookup by name and version, listings, errors."""

from __future__ import annotations

import threading

import pytest

from chainweaver import (
    ChainWeaverError,
    DuplicateFlowError,
    Flow,
    FlowGovernance,
    FlowLifecycle,
    FlowNotFoundError,
    FlowRegistry,
    FlowStep,
    FlowVersionNotFoundError,
    InvalidVersionError,
    LifecycleTransitionError,
)
from chainweaver.registry import RegistryChange


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


def test_set_lifecycle_replaces_the_version_with_new_governance() -> None:
    registry = FlowRegistry()
    old = registry.register_flow(Flow("a", "A.", [FlowStep("t")], version="1.0.0"))
    draft = registry.register_flow(Flow("a", "A.", [FlowStep("t")], version="2.0.0",
                                        governance=FlowGovernance(FlowLifecycle.DRAFT)))
    reviewed = registry.set_lifecycle("a", "reviewed")  # the latest version
    assert reviewed.governance.lifecycle is FlowLifecycle.REVIEWED
    assert draft.governance.lifecycle is FlowLifecycle.DRAFT  # flows stay immutable
    assert registry.get_flow("a") is reviewed
    archived = registry.set_lifecycle("a", FlowLifecycle.ARCHIVED, version="1.0")
    assert registry.get_flow("a", "1.0.0") is archived and archived is not old
    assert registry.latest_active("a") is None
    with pytest.raises(LifecycleTransitionError, match="'archived' to 'active'"):
        registry.set_lifecycle("a", "active", version="1.0.0")
    with pytest.raises(FlowNotFoundError):
        registry.set_lifecycle("nope", "archived")
    with pytest.raises(ValueError):
        registry.set_lifecycle("a", "retired")


def test_unregister_one_version_or_every_version() -> None:
    registry = FlowRegistry()
    for version in ("1.0.0", "2.0.0"):
        registry.register_flow(Flow("a", "A.", [FlowStep("t")], version=version))
    registry.unregister("a", "2.0")
    assert registry.versions("a") == ["1.0.0"]
    with pytest.raises(FlowVersionNotFoundError):
        registry.unregister("a", "3.0.0")
    registry.unregister("a")
    assert "a" not in registry and len(registry) == 0
    with pytest.raises(FlowNotFoundError):
        registry.unregister("a")
    # The name can be registered again.
    registry.register_flow(Flow("a", "A.", [FlowStep("t")], version="2.0.0"))
    assert registry.versions("a") == ["2.0.0"]


def test_states_never_change_after_they_are_taken() -> None:
    registry = FlowRegistry()
    first = registry.register_flow(Flow("a", "A.", [FlowStep("t")]))
    state = registry.state()
    assert registry.state() is state  # no change: the same state
    registry.set_lifecycle("a", "archived")
    registry.register_flow(Flow("b", "B.", [FlowStep("t")]))
    registry.unregister("a")
    assert state.latest("a") is first and "b" not in state and state.names() == ["a"]
    now = registry.state()
    assert now.sequence == state.sequence + 3
    assert now.names() == ["b"] and now.latest("a") is None


def test_listeners_hear_every_change_in_order_after_it_is_applied() -> None:
    registry = FlowRegistry()
    heard: list[tuple[str, str, str | None, int, bool]] = []

    def listen(change: RegistryChange) -> None:
        # The change is applied when the listener runs.
        heard.append((change.kind, change.name, change.version, change.sequence,
                      change.name in registry))

    unsubscribe = registry.subscribe(listen)
    registry.register_flow(Flow("a", "A.", [FlowStep("t")], version="1.0.0"))
    registry.set_lifecycle("a", "archived")
    registry.unregister("a")
    unsubscribe()
    unsubscribe()  # idempotent
    registry.register_flow(Flow("b", "B.", [FlowStep("t")]))
    assert heard == [("registered", "a", "1.0.0", 1, True),
                     ("lifecycle", "a", "1.0.0", 2, True),
                     ("unregistered", "a", None, 3, False)]


def test_a_listener_that_raises_refuses_the_change() -> None:
    registry = FlowRegistry()
    registry.register_flow(Flow("a", "A.", [FlowStep("t")]))
    sequences: list[int] = []

    def refuse_b(change: RegistryChange) -> None:
        sequences.append(change.sequence)
        if "b" in registry:
            raise ValueError("no b here")

    registry.subscribe(refuse_b)
    with pytest.raises(ValueError, match="no b here"):
        registry.register_flow(Flow("b", "B.", [FlowStep("t")]))
    assert "b" not in registry and registry.names() == ["a"]
    # The undo is a change of its own, so listeners that took the change follow it.
    assert sequences == [2, 3] and registry.sequence == 3


def test_changes_from_many_threads_are_serialised() -> None:
    registry = FlowRegistry()
    seen: list[int] = []
    registry.subscribe(lambda change: seen.append(change.sequence))

    def register(offset: int) -> None:
        for index in range(50):
            registry.register_flow(Flow(f"f{offset}_{index}", "F.", [FlowStep("t")]))

    threads = [threading.Thread(target=register, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(registry) == 200 and seen == list(range(1, 201))
