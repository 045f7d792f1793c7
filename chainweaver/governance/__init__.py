"""Governance shared by every replica and worker: operators' decisions kept in Redis.

``chainweaver flows archive|activate|deprecate|withdraw NAME`` (or
:meth:`GovernanceStore.change`) records a decision; every process started with
``--governance redis://...`` (``FlowServer(governance=...)``) applies it to its own
registry within milliseconds, and its server publishes the result as it does any
local change. See ``docs/live-governance.md``. Importing this package does not import
``redis``: :class:`GovernanceStore` does, when it is built.
"""

from .follower import SharedGovernance
from .overlay import GovernanceOverlay
from .state import (
    ACTIONS,
    DEPRECATED_NOTE,
    Action,
    Decision,
    GovernanceSettings,
    SharedState,
    UnreadableEntry,
    check_governance,
    governed,
    read_entry,
)
from .store import Change, GovernanceStateError, GovernanceStore

__all__ = ["ACTIONS", "DEPRECATED_NOTE", "Action", "Change", "Decision", "GovernanceOverlay",
           "GovernanceSettings", "GovernanceStateError", "GovernanceStore",
           "SharedGovernance", "SharedState", "UnreadableEntry", "check_governance",
           "governed", "read_entry"]
