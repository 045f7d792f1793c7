"""SideEffectLevel ordering, ToolSafetyContract defaults, merge_safety_contracts."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chainweaver import SideEffectLevel, ToolSafetyContract, merge_safety_contracts

LEVELS = list(SideEffectLevel)


def test_levels_are_ordered_none_read_write_external_destructive() -> None:
    assert [level.value for level in LEVELS] == [
        "none", "read", "write", "external", "destructive"
    ]
    assert (
        SideEffectLevel.NONE
        < SideEffectLevel.READ
        < SideEffectLevel.WRITE
        < SideEffectLevel.EXTERNAL
        < SideEffectLevel.DESTRUCTIVE
    )
    assert SideEffectLevel.DESTRUCTIVE > SideEffectLevel.WRITE >= SideEffectLevel.WRITE
    assert max(LEVELS) is SideEffectLevel.DESTRUCTIVE
    assert sorted(reversed(LEVELS)) == LEVELS
    assert [level.rank for level in LEVELS] == [0, 1, 2, 3, 4]


def test_level_str_and_comparison_with_other_types() -> None:
    assert str(SideEffectLevel.WRITE) == "write"
    assert SideEffectLevel("external") is SideEffectLevel.EXTERNAL
    assert SideEffectLevel.READ != "read"
    with pytest.raises(TypeError):
        _ = SideEffectLevel.READ < 1


@pytest.mark.parametrize(
    ("level", "idempotent"),
    [("none", True), ("read", True), ("write", False), ("external", False),
     ("destructive", False)],
)
def test_idempotent_is_derived_from_side_effects(level: str, idempotent: bool) -> None:
    contract = ToolSafetyContract(level)
    assert contract.side_effects is SideEffectLevel(level)  # strings are accepted
    assert contract.idempotent is idempotent
    assert contract.read_only is (level in ("none", "read"))
    assert contract.requires_approval is False
    assert contract.approval_reason is None
    assert contract.open_world is False


def test_explicit_idempotent_wins_over_the_derived_value() -> None:
    assert ToolSafetyContract(SideEffectLevel.WRITE, idempotent=True).idempotent is True
    assert ToolSafetyContract(SideEffectLevel.READ, idempotent=False).idempotent is False


def test_contract_is_frozen_and_rejects_unknown_levels() -> None:
    contract = ToolSafetyContract(SideEffectLevel.READ)
    with pytest.raises(dataclasses.FrozenInstanceError):
        contract.side_effects = SideEffectLevel.WRITE  # type: ignore[misc]
    with pytest.raises(ValueError):
        ToolSafetyContract("explosive")  # type: ignore[arg-type]


def test_to_dict() -> None:
    contract = ToolSafetyContract(
        "external", requires_approval=True, approval_reason="sends e-mail", open_world=True
    )
    assert contract.to_dict() == {
        "side_effects": "external",
        "idempotent": False,
        "requires_approval": True,
        "approval_reason": "sends e-mail",
        "open_world": True,
    }


def test_merge_of_nothing_is_none() -> None:
    assert merge_safety_contracts([]) is None
    assert merge_safety_contracts(iter(())) is None


def test_merge_most_restrictive_wins() -> None:
    merged = merge_safety_contracts([
        ToolSafetyContract("read", open_world=True),
        ToolSafetyContract("write", requires_approval=True, approval_reason="writes rows"),
        ToolSafetyContract("none"),
        ToolSafetyContract("external", idempotent=True, requires_approval=True,
                           approval_reason="charges a card"),
        ToolSafetyContract("write", requires_approval=True, approval_reason="writes rows"),
    ])
    assert merged == ToolSafetyContract(
        SideEffectLevel.EXTERNAL,
        idempotent=False,
        requires_approval=True,
        approval_reason="writes rows; charges a card",  # de-duplicated, in order
        open_world=True,
    )


def test_merge_of_one_contract_is_an_equal_contract() -> None:
    contract = ToolSafetyContract("read")
    assert merge_safety_contracts([contract]) == contract


contracts = st.builds(
    ToolSafetyContract,
    side_effects=st.sampled_from(LEVELS),
    idempotent=st.one_of(st.none(), st.booleans()),
    requires_approval=st.booleans(),
    approval_reason=st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
    open_world=st.booleans(),
)


@given(st.lists(contracts, min_size=1, max_size=8))
def test_merge_properties(items: list[ToolSafetyContract]) -> None:
    merged = merge_safety_contracts(items)
    assert merged is not None
    assert merged.side_effects == max(c.side_effects for c in items)
    assert all(merged.side_effects >= c.side_effects for c in items)
    assert merged.idempotent == all(c.idempotent for c in items)
    assert merged.requires_approval == any(c.requires_approval for c in items)
    assert merged.open_world == any(c.open_world for c in items)
    reasons = [c.approval_reason for c in items if c.approval_reason]
    expected = "; ".join(dict.fromkeys(reasons)) or None
    assert merged.approval_reason == expected


@given(st.lists(contracts, min_size=1, max_size=6), st.randoms())
def test_merge_ignores_order_except_for_reason_order(items, random) -> None:
    shuffled = list(items)
    random.shuffle(shuffled)
    a = merge_safety_contracts(items)
    b = merge_safety_contracts(shuffled)
    assert dataclasses.replace(a, approval_reason=None) == dataclasses.replace(
        b, approval_reason=None
    )
    assert set((a.approval_reason or "").split("; ")) == set(
        (b.approval_reason or "").split("; ")
    )


@given(contracts, contracts, contracts)
def test_merge_is_associative(a, b, c) -> None:
    left = merge_safety_contracts([merge_safety_contracts([a, b]), c])
    right = merge_safety_contracts([a, merge_safety_contracts([b, c])])
    flat = merge_safety_contracts([a, b, c])

    def without_reason(contract):
        return dataclasses.replace(contract, approval_reason=None)

    def reasons(contract):
        return set(filter(None, (contract.approval_reason or "").split("; ")))

    assert without_reason(left) == without_reason(right) == without_reason(flat)
    # Re-merging a merged contract may repeat a joined reason, but loses none.
    assert reasons(left) == reasons(right) == reasons(flat)
