"""Safety metadata: how much a tool can change the world, and how contracts combine."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache, total_ordering

from .errors import DefinitionError, member_of


@total_ordering
class SideEffectLevel(Enum):
    """How far a tool reaches, ordered ``none < read < write < external < destructive``."""

    NONE = "none"
    READ = "read"
    WRITE = "write"
    EXTERNAL = "external"
    DESTRUCTIVE = "destructive"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SideEffectLevel):
            return NotImplemented
        return self.rank < other.rank

    def __str__(self) -> str:
        return self.value


_RANKS = {level: index for index, level in enumerate(SideEffectLevel)}


@dataclass(frozen=True)
class ToolSafetyContract:
    """What a tool (or a whole flow) may do.

    ``idempotent`` defaults to true for ``none``/``read`` side effects and false
    otherwise; ``open_world`` says the tool talks to systems outside the caller's
    control even when its side effects are low.
    """

    side_effects: SideEffectLevel
    idempotent: bool | None = None
    requires_approval: bool = False
    approval_reason: str | None = None
    open_world: bool = False

    def __post_init__(self) -> None:
        # Accept plain strings ("read") so contracts read naturally in flow files.
        object.__setattr__(self, "side_effects", member_of(SideEffectLevel, self.side_effects,
                                                         "side_effects"))
        # Checked, not coerced: a truthy "no" would otherwise require approval.
        if self.idempotent is not None and not isinstance(self.idempotent, bool):
            raise DefinitionError(f"idempotent must be True, False or None, got "
                                  f"{self.idempotent!r}")
        for flag in ("requires_approval", "open_world"):
            if not isinstance(getattr(self, flag), bool):
                raise DefinitionError(f"{flag} must be True or False, got "
                                      f"{getattr(self, flag)!r}")
        if self.approval_reason is not None and not isinstance(self.approval_reason, str):
            raise DefinitionError(f"approval_reason must be a string or None, got "
                                  f"{self.approval_reason!r}")
        if self.idempotent is None:
            object.__setattr__(
                self, "idempotent", self.side_effects <= SideEffectLevel.READ
            )

    @property
    def read_only(self) -> bool:
        return self.side_effects <= SideEffectLevel.READ

    def to_dict(self) -> dict[str, object]:
        return {
            "side_effects": self.side_effects.value,
            "idempotent": self.idempotent,
            "requires_approval": self.requires_approval,
            "approval_reason": self.approval_reason,
            "open_world": self.open_world,
        }


def merge_safety_contracts(
    contracts: Iterable[ToolSafetyContract],
) -> ToolSafetyContract | None:
    """Combine contracts so the most restrictive wins; ``None`` for no contracts.

    Highest side effect, idempotent only if all are, approval if any requires it,
    open world if any is. Approval reasons are kept, de-duplicated, in order.
    """
    contracts = tuple(contracts)
    if not contracts:
        return None
    try:
        return _merge_cached(contracts)
    except TypeError:  # a field that cannot be hashed (e.g. a list as the reason)
        return _merge(contracts)


# Contracts are immutable values and a catalogue combines a few tools into many flows,
# so a server deciding on 20,000 flows merges the same few tuples over and over.
@lru_cache(maxsize=1024)
def _merge_cached(contracts: tuple[ToolSafetyContract, ...]) -> ToolSafetyContract:
    return _merge(contracts)


def _merge(contracts: tuple[ToolSafetyContract, ...]) -> ToolSafetyContract:
    reasons: list[str] = []
    for contract in contracts:
        if contract.approval_reason and contract.approval_reason not in reasons:
            reasons.append(contract.approval_reason)
    return ToolSafetyContract(
        side_effects=max(c.side_effects for c in contracts),
        idempotent=all(c.idempotent for c in contracts),
        requires_approval=any(c.requires_approval for c in contracts),
        approval_reason="; ".join(reasons) or None,
        open_world=any(c.open_world for c in contracts),
    )
