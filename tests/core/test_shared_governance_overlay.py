"""The shared governance overlay on one registry, without Redis: what each decision makes
of a flow version, and that the registry's listeners see one ordinary change per name."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from chainweaver import Flow, FlowGovernance, FlowLifecycle, FlowRegistry, FlowStep
from chainweaver.errors import ExposureConfigError, InvalidVersionError
from chainweaver.governance import (
    DEPRECATED_NOTE,
    Decision,
    GovernanceOverlay,
    GovernanceSettings,
    SharedState,
    check_governance,
)
from chainweaver.governance.follower import SharedGovernance
from chainweaver.governance.state import check_version


def flow(name: str, version: str = "1.0.0", lifecycle: str = "active") -> Flow:
    return Flow(name, f"{name} {version}", [FlowStep("tool")], version=version,
                governance=FlowGovernance(lifecycle=FlowLifecycle(lifecycle)))


def state(version: int, **decisions: Decision) -> SharedState:
    return SharedState(version, MappingProxyType(decisions))


def shown(registry: FlowRegistry, name: str) -> list[tuple[str, str, str]]:
    return [(f.version, f.governance.lifecycle.value, f.description)
            for f in registry.state().flows.get(name, ())]


@pytest.fixture
def registry() -> FlowRegistry:
    registry = FlowRegistry()
    for version in ("1.0.0", "2.0.0"):
        registry.register_flow(flow("orders", version))
    registry.register_flow(flow("search"))
    return registry


def test_archiving_every_version_is_one_change_per_name(registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)
    changes = []
    registry.subscribe(changes.append)
    assert overlay.apply(state(1, orders=Decision(all="archived"))) == ["orders"]
    assert shown(registry, "orders") == [("1.0.0", "archived", "orders 1.0.0"),
                                         ("2.0.0", "archived", "orders 2.0.0")]
    assert [(c.kind, c.name) for c in changes] == [("lifecycle", "orders")]
    assert shown(registry, "search") == [("1.0.0", "active", "search 1.0.0")]
    assert overlay.apply(state(2, orders=Decision(all="archived"))) == []  # nothing differs


def test_activate_undoes_an_archive_that_local_rules_would_refuse(registry: FlowRegistry
                                                                  ) -> None:
    overlay = GovernanceOverlay(registry)
    overlay.apply(state(1, orders=Decision(all="archived")))
    overlay.apply(state(2, orders=Decision(all="active")))
    assert [v[1] for v in shown(registry, "orders")] == ["active", "active"]


def test_a_version_decision_beats_the_all_versions_one_compared_as_versions(
        registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)
    overlay.apply(state(1, orders=Decision(all="archived", versions={"2.0": "deprecated"})))
    assert shown(registry, "orders") == [
        ("1.0.0", "archived", "orders 1.0.0"),
        ("2.0.0", "active", DEPRECATED_NOTE + "orders 2.0.0")]


def test_withdrawn_versions_leave_the_registry_and_come_back(registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)
    overlay.apply(state(1, orders=Decision(versions={"2.0.0": "withdrawn"})))
    assert [v[0] for v in shown(registry, "orders")] == ["1.0.0"]
    overlay.apply(state(2, orders=Decision(all="withdrawn")))
    assert "orders" not in registry
    overlay.apply(state(3))  # the decision is gone: the definitions stand again
    assert shown(registry, "orders") == [("1.0.0", "active", "orders 1.0.0"),
                                         ("2.0.0", "active", "orders 2.0.0")]


def test_a_flow_registered_later_is_governed_inside_its_own_change(
        registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)
    overlay.apply(state(1, orders=Decision(all="archived")))
    seen = []
    # A listener subscribed after the overlay (as a server's snapshot follower is)
    # sees the governed flows when the registering change reaches it.
    registry.subscribe(lambda change: seen.append(shown(registry, "orders")))
    registry.register_flow(flow("orders", "3.0.0"))  # a reloaded flow file, say
    assert [v[1] for v in shown(registry, "orders")] == ["archived"] * 3
    assert all(v[1] == "archived" for v in seen[-1])
    registry.unregister("orders", "1.0.0")  # the owner's own change is kept
    overlay.apply(state(2))
    assert [v[:2] for v in shown(registry, "orders")] == [("2.0.0", "active"),
                                                          ("3.0.0", "active")]


def test_the_heartbeat_names_every_flow_defined_here_withdrawn_ones_too(
        registry: FlowRegistry) -> None:
    follower = SharedGovernance(GovernanceSettings(url="redis://127.0.0.1:1/0"), registry)
    assert follower.record()["flows"] == ["orders", "search"]
    follower.overlay.apply(state(1, orders=Decision(all="withdrawn")))
    assert "orders" not in registry.state().flows
    # `chainweaver flows activate orders` must still find the name.
    assert follower.record()["flows"] == ["orders", "search"]


def test_suspending_archives_everything_until_resumed(registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)
    overlay.apply(state(1, search=Decision(all="deprecated")))
    assert overlay.suspend() == 2
    assert {f.governance.lifecycle for f in registry.list_flows()} == {FlowLifecycle.ARCHIVED}
    overlay.apply(state(2, search=Decision(all="archived")))  # kept for the resume
    overlay.resume()
    assert [v[1] for v in shown(registry, "orders")] == ["active", "active"]
    assert shown(registry, "search") == [("1.0.0", "archived", "search 1.0.0")]


def test_a_refused_snapshot_leaves_the_registry_as_it_was(registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)

    def refuse(change: object) -> None:
        raise ExposureConfigError("collides")

    registry.subscribe(refuse)
    assert overlay.apply(state(1, orders=Decision(all="archived"))) == []
    assert [v[1] for v in shown(registry, "orders")] == ["active", "active"]


def test_settings_are_checked() -> None:
    assert check_governance("redis://127.0.0.1:6379/0") == GovernanceSettings(
        "redis://127.0.0.1:6379/0")
    assert check_governance(None) is None
    for bad in ({"url": "http://x"}, {"url": "redis://x", "confirm_interval": 0},
                {"url": "redis://x", "stop_serving_after": float("nan")},
                {"url": "redis://x", "prefix": " "}):
        with pytest.raises(ExposureConfigError):
            GovernanceSettings(**bad)
    with pytest.raises(ExposureConfigError):
        check_governance(42)
    with pytest.raises(InvalidVersionError):
        check_version("not a version")


def test_decisions_read_back_from_json() -> None:
    decision = Decision.from_json('{"all": "archived", "versions": {"2.0": "active"}}')
    assert decision.for_version("2.0.0") == "active"
    assert decision.for_version("1.0.0") == "archived"
    with pytest.raises(ValueError):
        Decision.from_json('{"all": "gone"}')
