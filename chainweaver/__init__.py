"""ChainWeaver: typed tools wired into versioned, governed, deterministic flows.

The core API imports without the ``mcp`` extra; ``chainweaver.mcp`` publishes flows
to MCP clients.
"""

from .checkpoints import (
    CheckpointMismatchError,
    CheckpointStore,
    CheckpointStoreError,
    MemoryCheckpointStore,
)
from .errors import (
    ChainWeaverError,
    DefinitionError,
    DuplicateFlowError,
    DuplicateToolError,
    ExposureConfigError,
    FlowFileError,
    FlowNotFoundError,
    FlowValidationError,
    FlowVersionNotFoundError,
    InvalidNameError,
    InvalidVersionError,
    LifecycleTransitionError,
    PromptDefinitionError,
    ToolNotFoundError,
)
from .executor import ALWAYS_APPROVE, ErrorInfo, ExecutionResult, FlowExecutor, StepRecord
from .files import load_flows
from .flows import Flow, FlowGovernance, FlowLifecycle, FlowStep
from .grants import Caller, Delegation, Grants, StepDecision, StepRequest
from .mappings import Const, Pointer
from .prompts import FlowPrompt, PromptArgument, PromptMessage
from .registry import FlowRegistry, RegistryChange, RegistryState
from .retry import RetryPolicy
from .safety import SideEffectLevel, ToolSafetyContract, merge_safety_contracts
from .tools import IdempotencyKey, Tool, tool

__version__ = "0.1.0"

__all__ = [
    "ALWAYS_APPROVE",
    "Caller",
    "Delegation",
    "Grants",
    "StepDecision",
    "StepRequest",
    "ChainWeaverError",
    "CheckpointMismatchError",
    "CheckpointStoreError",
    "CheckpointStore",
    "Const",
    "DefinitionError",
    "DuplicateFlowError",
    "DuplicateToolError",
    "ErrorInfo",
    "ExecutionResult",
    "ExposureConfigError",
    "Flow",
    "FlowExecutor",
    "FlowFileError",
    "FlowGovernance",
    "FlowLifecycle",
    "FlowNotFoundError",
    "FlowPrompt",
    "FlowRegistry",
    "RegistryChange",
    "RegistryState",
    "FlowStep",
    "FlowValidationError",
    "FlowVersionNotFoundError",
    "IdempotencyKey",
    "InvalidNameError",
    "InvalidVersionError",
    "LifecycleTransitionError",
    "MemoryCheckpointStore",
    "Pointer",
    "PromptArgument",
    "PromptDefinitionError",
    "PromptMessage",
    "RetryPolicy",
    "SideEffectLevel",
    "StepRecord",
    "Tool",
    "ToolNotFoundError",
    "ToolSafetyContract",
    "__version__",
    "load_flows",
    "merge_safety_contracts",
    "tool",
]
