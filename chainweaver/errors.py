"""The ChainWeaver exception hierarchy: every error the library raises derives from
:class:`ChainWeaverError`; and how every message says that an optional extra is missing.

ChainWeaver is installed from a clone of its repository. The ``chainweaver`` on the
public package index is another project (the reference package), so every install
instruction this package prints names the clone form.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

E = TypeVar("E", bound=Enum)


class ChainWeaverError(Exception):
    """Base class of every exception ChainWeaver raises."""


class DefinitionError(ChainWeaverError, ValueError):
    """A tool, flow, prompt or server was defined with invalid values."""


def member_of(kind: type[E], value: object, what: str) -> E:
    """``value`` (a member or its value) as a member of ``kind``, else a
    :class:`DefinitionError` naming ``what`` and listing the values allowed."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in kind)
        raise DefinitionError(f"{what} must be one of {allowed}, got {value!r}") from None


class InvalidNameError(DefinitionError):
    """A flow, tool or prompt name does not match the required pattern."""


class InvalidVersionError(DefinitionError):
    """A version string is neither PEP 440 nor semver."""


class PromptDefinitionError(DefinitionError):
    """A ``FlowPrompt`` is malformed (bad name, role, placeholder or duplicate)."""


class LifecycleTransitionError(ChainWeaverError):
    """A governance lifecycle transition that is not allowed."""


class DuplicateFlowError(ChainWeaverError):
    """A flow with the same name and version is already registered."""


class DuplicateToolError(ChainWeaverError):
    """A tool with the same name is already registered."""


class FlowNotFoundError(ChainWeaverError, LookupError):
    """No flow is registered under that name."""


class FlowVersionNotFoundError(FlowNotFoundError):
    """The flow exists, but not in the requested version."""


class ToolNotFoundError(ChainWeaverError, LookupError):
    """No tool is registered under that name."""


class FlowValidationError(ChainWeaverError):
    """A flow references tools or fields that do not exist (see ``FlowExecutor.check_flow``)."""

    def __init__(self, flow_name: str, problems: list[str]) -> None:
        self.flow_name = flow_name
        self.problems = list(problems)
        super().__init__(f"flow {flow_name!r} is invalid: " + "; ".join(self.problems))


class ExposureConfigError(DefinitionError):
    """A ``FlowServer`` policy or naming configuration is invalid."""


class FlowFileError(DefinitionError):
    """A flow file is unreadable or invalid: names the file, the field and the problem."""

    def __init__(self, path: object, field: str | None, problem: str) -> None:
        self.path = str(path)
        # A field path holds the file's own keys: shown, never obeyed by a terminal.
        self.field = None if field is None else printable(field)
        self.problem = printable(problem)
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(f"{where}: {problem}")


def printable(text: str) -> str:
    """``text`` with every control character escaped (``\\x1b``, ``\\n``), so that text
    from a file printed in a message can neither move a terminal's cursor nor break the
    one line the message is."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def install_hint(*extras: str) -> str:
    """The command that installs ``extras``, as every message of this package says it."""
    return f"pip install -e '.[{','.join(extras)}]' in a clone of ChainWeaver"


def needs_extra(what: str, *extras: str) -> str:
    """One line saying that ``what`` needs ``extras`` and how to install them."""
    names = " and ".join(f"the {extra} extra" for extra in extras)
    return f"{what} needs {names}: {install_hint(*extras)}"
