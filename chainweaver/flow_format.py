"""The flow-file format as pydantic models: the keys :mod:`chainweaver.flow_data` accepts,
and the JSON Schema editors validate flow files with (``chainweaver schema`` prints it).

:mod:`chainweaver.flow_data` builds flows from file content with its own checks, so that
every error names the file, the field and what is wrong in flow-author words; it takes the
allowed keys of each part from these models, so the schema and the reader cannot drift
apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from .flows import MAX_STEPS, MAX_TIMEOUT_SECONDS, STEP_ID_PATTERN
from .retry import CLASS_PATH_PATTERN, MAX_ATTEMPTS, MAX_BACKOFF_SECONDS
from .versions import MAX_VERSION_LENGTH

NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
_IDENTIFIERS = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
MODEL_REFERENCE_PATTERN = rf"^{_IDENTIFIERS}:{_IDENTIFIERS}$"
CLASS_NAME_PATTERN = CLASS_PATH_PATTERN  # a built-in exception name or a module path
# Step and retry keys may be left out, but the reader takes no null for them: the schema
# must not offer one (SkipJsonSchema keeps None out of it).
Absent = SkipJsonSchema[None]
SCHEMA_ID = "https://chainweaver.dev/schemas/flow-file.json"


MAX_FILE_BYTES = 1_048_576
MAX_DEPTH = 64
MAX_STRING_LENGTH = 65_536
MAX_NUMBER_LENGTH = 100


@dataclass(frozen=True)
class FlowFileLimits:
    """What a flow file may hold, checked when it is read and before any flow is built.

    A file over a limit is a :class:`~chainweaver.FlowFileError` naming the file and the
    line (or, for data given to ``flow_from_data``, the field). YAML anchors, aliases and
    ``<<`` merge keys are always refused: an alias multiplies what a small file holds.

    - ``max_bytes``: the file's size in bytes.
    - ``max_depth``: how deeply mappings and lists nest (the top-level mapping is 1).
    - ``max_string_length``: the characters of one string, keys included.
    - ``max_number_length``: the characters of one number as written (digits, sign,
      point, exponent); a value must also be a finite number, and an integer given in
      data has at most this many digits.
    """

    max_bytes: int = MAX_FILE_BYTES
    max_depth: int = MAX_DEPTH
    max_string_length: int = MAX_STRING_LENGTH
    max_number_length: int = MAX_NUMBER_LENGTH

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth", "max_string_length", "max_number_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FlowFileLimits.{name} must be a positive integer, "
                                 f"got {value!r}")


DEFAULT_LIMITS = FlowFileLimits()


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RetryFormat(_Part):
    """How a failing step is retried (only steps whose tool is idempotent)."""

    max_attempts: int = Field(3, ge=1, le=MAX_ATTEMPTS,
                              description="Attempts in all, the first included")
    backoff_seconds: float = Field(0.1, ge=0, le=MAX_BACKOFF_SECONDS,
                                   description="Wait after the first failure; doubles after "
                                   "each further failure")
    max_backoff_seconds: float = Field(5.0, ge=0, le=MAX_BACKOFF_SECONDS,
                                       description="Longest wait")
    jitter: float = Field(0.0, ge=0, le=1, description="Random spread of each wait, as a "
                          "fraction")
    retry_on: list[Annotated[str, Field(pattern=CLASS_NAME_PATTERN)]] = Field(
        ["Exception"], min_length=1, description="Exception classes to retry (base classes "
        "match subclasses): built-in exception names, or importable "
        "'package.module.ClassName' paths")


class ConstFormat(_Part):
    """A constant for a tool input field."""

    const: Any = Field(description="Any JSON value, given to the field as is")


class PointerFormat(_Part):
    """A JSON pointer (RFC 6901) into the context."""

    pointer: str = Field(pattern=r"^/[^/]", description="'/key/inner/0': a context key, "
                         "then keys (or list indices) inside its value")


class GrantsFormat(_Part):
    """What a caller must hold (docs/step-grants.md)."""

    scopes: list[Annotated[str, Field(min_length=1)]] = Field(
        [], description="Scopes the caller must all hold")
    claims: dict[str, Annotated[str, Field(min_length=1)]
                 | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
                 ] = Field({}, description="Claim name -> the accepted value (or values): "
                           "the caller's claim must hold one of them")


# A list of scopes, or scopes and claims.
RequiresFormat = list[Annotated[str, Field(min_length=1)]] | GrantsFormat


class DelegationFormat(_Part):
    """A step the flow runs on its own grant, beyond its caller's."""

    step: str = Field(min_length=1, description="A step id, or a path 'outer/inner' into "
                      "a sub-flow step")
    reason: str = Field(min_length=1, description="Why the flow may run it for callers "
                        "who lack its grants (shown in reports, inspect and the audit)")


class StepFormat(_Part):
    """One step: a tool (``tool``) or a registered flow run as one step (``flow``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": ["tool"]}, {"required": ["flow"]}],
        # fallback and on_error: fallback go together (as FlowStep checks).
        "allOf": [
            {"if": {"required": ["fallback"]},
             "then": {"required": ["on_error"],
                      "properties": {"on_error": {"const": "fallback"}}}},
            {"if": {"required": ["on_error"],
                    "properties": {"on_error": {"const": "fallback"}}},
             "then": {"required": ["fallback"]}},
        ]})

    # Constraints sit on the type, not on Field(None, ...): on an optional field pydantic
    # would leave a pattern out of the JSON Schema and write "gt"/"le", which no
    # validator reads, so the schema would accept steps the reader refuses.
    tool: Name | Absent = Field(None, description="The tool to call")
    flow: Name | Absent = Field(None, description="A registered flow to run as this step")
    id: Annotated[str, Field(pattern=STEP_ID_PATTERN)] | Absent = Field(
        None, description="Unique step id (default: the tool or flow name, when no other "
        "step uses it); no '/', no '#' and no control characters")
    after: list[str] | Absent = Field(None, json_schema_extra={"uniqueItems": True},
                                      description="Step ids this step waits for (default: "
                                      "the previous step; [] starts at once)")
    when: Annotated[str, Field(min_length=1)] | Absent = Field(
        None, description="Condition over context keys: names, "
                               "literals, comparisons, in, is None, and, or, not")
    input_mapping: dict[str, str | PointerFormat | ConstFormat] = Field(
        {}, description="Tool input field -> context key, {pointer: /key/inner} or "
        "{const: value}")
    output_mapping: dict[str, str] = Field({}, description="Context key -> output field "
                                           "(only these keys are written)")
    retry: RetryFormat | Absent = None
    timeout: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] | Absent = Field(
        None, description="Seconds per attempt")
    on_error: Literal["fail", "skip", "fallback"] = "fail"
    fallback: Name | Absent = Field(None, description="Tool to run on the same input when "
                                    "the step fails (on_error: fallback)")
    requires: RequiresFormat | Absent = Field(None, description="Grants the caller must "
                                              "hold for this step (beside its tool's own)")

    @model_validator(mode="after")
    def _tool_or_flow(self) -> StepFormat:
        if (self.tool is None) == (self.flow is None):
            raise ValueError("a step needs exactly one of 'tool' or 'flow'")
        return self


class GovernanceFormat(_Part):
    lifecycle: Literal["draft", "reviewed", "active", "archived"] = "active"
    owner: str | None = None
    publish: bool = Field(True, description="false: no MCP server publishes this flow, "
                          "whatever its policy (the flow still runs, and as a sub-flow)")


class SafetyFormat(_Part):
    """The flow's own safety contract (``idempotent: null`` means the level's default)."""

    side_effects: Literal["none", "read", "write", "external", "destructive"]
    idempotent: bool | None = None
    requires_approval: bool = False
    approval_reason: str | None = None
    open_world: bool = False


class PromptArgumentFormat(_Part):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str = ""
    required: bool = False


class PromptMessageFormat(_Part):
    role: Literal["user", "assistant"]
    text: str


class PromptFormat(_Part):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    title: str | None = None
    description: str = ""
    arguments: list[PromptArgumentFormat] = []
    messages: list[PromptMessageFormat] = Field(min_length=1)


# "package.module:Model", or an inline JSON Schema of an object (its keywords are
# checked by the reader, docs/flow-files.md lists them).
SchemaRef = Annotated[str, Field(pattern=MODEL_REFERENCE_PATTERN)] | Annotated[
    dict[str, Any], Field(json_schema_extra={"required": ["type"], "properties": {
        "type": {"const": "object"}}})] | None


class FlowFileFormat(_Part):
    """One flow per file (``*.flow.yaml``, ``*.flow.yml`` or ``*.flow.json``)."""

    model_config = ConfigDict(extra="forbid", title="ChainWeaver flow file")

    name: str = Field(pattern=NAME_PATTERN)
    version: str = Field("1.0.0", min_length=1, max_length=MAX_VERSION_LENGTH,
                         description="A semver or PEP 440 version")
    title: str | None = None
    description: str
    governance: GovernanceFormat | None = None
    safety: SafetyFormat | None = None
    input_schema: SchemaRef = Field(None, description="'package.module:Model' or an inline "
                                    "JSON Schema object")
    output_schema: SchemaRef = Field(None, description="'package.module:Model' or an inline "
                                     "JSON Schema object")
    steps: list[Annotated[str, Field(pattern=NAME_PATTERN)] | StepFormat] = Field(
        min_length=1, max_length=MAX_STEPS, description="A tool name, or a step")
    prompts: list[PromptFormat] = []
    task_mode: Literal["forbidden", "optional", "required"] | Absent = Field(
        None, description="Whether MCP clients may run the flow as a background task "
        "(default: the server's setting)")
    requires: RequiresFormat | Absent = Field(None, description="Grants a caller must hold "
                                              "to run this flow (as a sub-flow too)")
    delegations: list[DelegationFormat] = Field(
        [], description="Steps the flow runs beyond its caller's grants, each with a reason")


def keys(model: type[BaseModel]) -> tuple[str, ...]:
    """The keys a part of a flow file may have, in declaration order."""
    return tuple(model.model_fields)


def flow_file_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a flow file."""
    schema = FlowFileFormat.model_json_schema()
    for properties in (schema["$defs"]["StepFormat"]["properties"],
                       schema["$defs"]["RetryFormat"]["properties"], schema["properties"]):
        for spec in properties.values():
            if "default" in spec and spec["default"] is None:
                del spec["default"]  # a key to leave out, not to set to null
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            **schema}
