"""Shared governance entries as read back and as written, without Redis: an entry this
release cannot read withholds its flow (never "as defined") and does not stop the other
entries from applying; a version has one decision whatever its spelling; a decision the
registry refuses withholds its flow and is never reported as applied."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from chainweaver import Flow, FlowGovernance, FlowLifecycle, FlowRegistry, FlowStep
from chainweaver.errors import DefinitionError, ExposureConfigError
from chainweaver.governance import Decision, GovernanceOverlay, GovernanceStore, SharedState
from chainweaver.governance.state import (
    DEPRECATED_NOTE,
    UNREADABLE,
    UnreadableEntry,
    masked_reason,
    masked_url,
    read_entry,
)
from chainweaver.governance.store import changed_entry

UNREADABLE_ENTRIES = {
    "unknown action": ('{"all": "paused", "versions": {}}', "'paused'"),
    "unknown action for a version": ('{"versions": {"2.0": "paused"}}', "'paused'"),
    "not JSON": ("archived", "not JSON"),
    "not UTF-8": (b'{"all": "\xff"}', "not UTF-8"),
    "not an object": ('["archived"]', "not a JSON object"),
    "a newer release's field": ('{"all": "archived", "until": 5}', "'until'"),
    "a key that is not a version": ('{"versions": {"2.x-final!": "archived"}}',
                                    "'2.x-final!'"),
    "versions not an object": ('{"versions": "2.0"}', "'versions' is not a JSON object"),
    # Deeper than the JSON decoder goes: RecursionError, which is not a ValueError.
    "nested too deep": ('{"all": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
}


def flow(name: str, version: str = "1.0.0") -> Flow:
    return Flow(name, f"{name} {version}", [FlowStep("tool")], version=version)


def state(version: int, **decisions: Decision) -> SharedState:
    return SharedState(version, MappingProxyType(decisions))


def shown(registry: FlowRegistry, name: str) -> list[tuple[str, str, str | None]]:
    return [(f.version, f.governance.lifecycle.value, f.governance.withheld)
            for f in registry.state().flows.get(name, ())]


@pytest.fixture
def registry() -> FlowRegistry:
    registry = FlowRegistry()
    for version in ("1.0.0", "2.0.0"):
        registry.register_flow(flow("orders", version))
    registry.register_flow(flow("search"))
    return registry


@pytest.mark.parametrize("kind", list(UNREADABLE_ENTRIES))
def test_an_entry_that_cannot_be_read_withholds_its_flow_and_says_why(kind: str) -> None:
    raw, why = UNREADABLE_ENTRIES[kind]
    with pytest.raises(UnreadableEntry, match=f".*{why[:8]}"):
        Decision.from_json(raw)
    decision = read_entry(raw)
    assert decision.withheld is not None
    assert decision.withheld.startswith(UNREADABLE) and why in decision.withheld
    governed = decision.govern(flow("orders"))
    assert governed is not None and governed.governance.withheld == decision.withheld
    assert governed.governance.lifecycle is FlowLifecycle.ARCHIVED  # no sub-flow runs it
    assert read_entry('{"all": "archived", "versions": {}}') == Decision(all="archived")
    assert read_entry('{"versions": []}') == Decision()  # Lua's empty table, both ways


def test_two_spellings_of_one_version_are_one_decision_the_stricter_when_unordered() -> None:
    # Only releases before this one stored two spellings; the order of an entry's keys
    # is not the order of the changes, so the more restrictive decision wins.
    for versions in ('{"1.0": "deprecated", "1.0.0": "archived"}',
                     '{"1.0.0": "archived", "1.0": "deprecated"}'):
        decision = Decision.from_json(f'{{"versions": {versions}}}')
        assert dict(decision.versions) == {"1.0.0": "archived"}
        assert decision.for_version("1") == decision.for_version("1.0.0") == "archived"


def test_a_version_decision_replaces_every_spelling_of_that_version() -> None:
    entry = changed_entry(None, "1.0", "deprecated")
    entry = changed_entry(entry, "1.0.0", "archived")
    entry = changed_entry(entry, "2.0", "active")
    assert json.loads(entry) == {"versions": {"1.0.0": "archived", "2.0": "active"}}
    assert Decision.from_json(entry).for_version("1.0") == "archived"
    entry = changed_entry(entry, "1", "active")  # the latest decision wins, any spelling
    assert Decision.from_json(entry).for_version("1.0.0") == "active"
    assert json.loads(changed_entry(entry, None, "withdrawn")) == {"all": "withdrawn",
                                                                  "versions": {}}


def test_a_version_decision_keeps_what_a_newer_release_wrote_and_says_it_is_unreadable(
        ) -> None:
    newer = b'{"all": "archived", "versions": {"3.0": "paused"}, "until": 5}'
    entry = changed_entry(newer, "2.0", "active")
    assert json.loads(entry) == {"all": "archived", "until": 5,
                                 "versions": {"3.0": "paused", "2.0": "active"}}
    assert read_entry(entry).withheld is not None
    with pytest.raises(UnreadableEntry, match="not JSON.*all versions"):
        changed_entry(b"junk", "2.0", "active")
    assert read_entry(changed_entry(b"junk", None, "active")) == Decision(all="active")


@pytest.mark.anyio
@pytest.mark.tasks  # the Redis client comes with the tasks extra
async def test_the_store_refuses_an_action_or_version_it_does_not_know() -> None:
    # Refused before anything is sent: nothing listens on port 1.
    store = GovernanceStore("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(ValueError, match="unknown governance action 'paused'"):
            await store.change("orders", None, "paused", by="ops")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="neither a PEP 440 nor a semver"):
            await store.change("orders", "1.0 final", "archived", by="ops")
        with pytest.raises(ValueError, match="flow name"):
            await store.change(" ", None, "archived", by="ops")
    finally:
        await store.aclose()


def test_an_unreadable_entry_withholds_every_version_and_the_others_apply(
        registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)
    unreadable = read_entry('{"all": "paused"}')
    assert overlay.apply(state(1, orders=unreadable, search=Decision(all="archived"))) == [
        "orders", "search"]
    assert shown(registry, "orders") == [("1.0.0", "archived", unreadable.withheld),
                                         ("2.0.0", "archived", unreadable.withheld)]
    assert shown(registry, "search") == [("1.0.0", "archived", None)]
    assert overlay.applied_version == 1 and overlay.complete
    assert overlay.state.unreadable == {"orders": unreadable.withheld}
    registry.register_flow(flow("orders", "3.0.0"))  # a reloaded flow file: withheld too
    assert [v[2] for v in shown(registry, "orders")] == [unreadable.withheld] * 3


def test_an_entry_readable_again_governs_its_flow_again(registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)
    overlay.apply(state(1, orders=read_entry("junk")))
    overlay.apply(state(2, orders=Decision(versions={"2.0": "deprecated"})))
    assert [(f.version, f.governance.lifecycle.value, f.governance.withheld, f.description)
            for f in registry.state().flows["orders"]] == [
        ("1.0.0", "active", None, "orders 1.0.0"),
        ("2.0.0", "active", None, DEPRECATED_NOTE + "orders 2.0.0")]
    overlay.apply(state(3))  # the entry is gone: the definitions stand
    assert shown(registry, "orders") == [("1.0.0", "active", None), ("2.0.0", "active", None)]


def test_an_unreadable_entry_is_logged_once_naming_the_flow(
        registry: FlowRegistry, caplog: pytest.LogCaptureFixture) -> None:
    overlay = GovernanceOverlay(registry)
    caplog.set_level("WARNING", logger="chainweaver.governance")
    overlay.apply(state(1, orders=read_entry("junk")))
    overlay.apply(state(2, orders=read_entry("junk"), search=Decision(all="archived")))
    overlay.apply(state(3, orders=read_entry("junk"), search=Decision(all="active")))
    warned = [r.getMessage() for r in caplog.records if "'orders'" in r.getMessage()]
    assert len(warned) == 1 and "not served" in warned[0] and "not JSON" in warned[0]
    overlay.apply(state(4, orders=Decision(all="active")))
    assert "can be read again" in caplog.records[-1].getMessage()


def test_a_decision_the_registry_refuses_withholds_the_flow_and_is_not_applied(
        registry: FlowRegistry) -> None:
    overlay = GovernanceOverlay(registry)

    def refuse_active_orders(change: object) -> None:  # a server that cannot publish it
        if any(f.governance.lifecycle is FlowLifecycle.ACTIVE and not f.governance.withheld
               for f in registry.state().flows.get("orders", ())):
            raise ExposureConfigError("prompt name 'orders__help' collides")

    registry.register_flow(Flow("orders", "archived", [FlowStep("tool")], version="9.0.0",
                                governance=FlowGovernance(FlowLifecycle.ARCHIVED)))
    for version in ("1.0.0", "2.0.0"):
        registry.unregister("orders", version)
    registry.subscribe(refuse_active_orders)
    overlay.apply(state(1, orders=Decision(all="active"), search=Decision(all="archived")))
    (orders,) = registry.state().flows["orders"]
    assert orders.governance.withheld is not None and "collides" in orders.governance.withheld
    assert shown(registry, "search") == [("1.0.0", "archived", None)]  # the rest applied
    assert overlay.applied_version == 0 and not overlay.complete
    assert "collides" in overlay.failed["orders"]
    overlay.apply(state(2, orders=Decision(all="active"), search=Decision(all="archived")))
    assert overlay.applied_version == 0  # tried again, refused again
    overlay.apply(state(3, orders=Decision(all="archived"), search=Decision(all="archived")))
    assert shown(registry, "orders") == [("9.0.0", "archived", None)]
    assert overlay.applied_version == 3 and overlay.complete and not overlay.failed


def test_urls_and_reasons_never_show_a_password() -> None:
    assert masked_url("redis://:s3cret@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert masked_url("rediss://ops:p@ss@redis.internal/2") == "rediss://ops:***@redis.internal/2"
    assert masked_url("redis://h:6379/0?password=s3cret&db=1") == \
        "redis://h:6379/0?password=***&db=1"
    assert masked_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    reason = masked_reason(ValueError("AUTH s3cret failed"), "redis://:s3cret@h/0")
    assert reason == "ValueError: AUTH *** failed"


def test_withheld_is_a_reason() -> None:
    with pytest.raises(DefinitionError, match="withheld must be None or a reason"):
        FlowGovernance(withheld=" ")
    assert FlowGovernance().withheld is None
