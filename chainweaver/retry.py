"""Retry policies: how often a failing step is tried again, how long it waits in between,
and which exceptions it retries (:func:`exception_class` reads a ``retry_on`` entry)."""

from __future__ import annotations

import builtins
import difflib
import pkgutil
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import DefinitionError

MAX_ATTEMPTS = 100  # a retry policy's limits: beyond them a policy is a mistake
MAX_BACKOFF_SECONDS = 3600


NOT_IMPORTED = ("a flow file only names what is already imported (a --tools module, or "
                "a module it imports) and never imports a module itself")


def imported_attribute(path: str) -> Any:
    """The object ``package.module:Name`` or ``package.module.Name`` names, found in a
    module that is already imported: nothing is imported, so no module's code runs.
    ValueError says what is missing."""
    module_name, colon, attribute = path.partition(":")
    if colon:
        module = sys.modules.get(module_name)
    else:  # the longest imported prefix is the module, the rest attributes
        parts = path.split(".")
        module = None
        for cut in range(len(parts) - 1, 0, -1):
            module = sys.modules.get(".".join(parts[:cut]))
            if module is not None:
                module_name, attribute = ".".join(parts[:cut]), ".".join(parts[cut:])
                break
        else:
            module_name = ".".join(parts[:-1])
    if module is None:
        raise ValueError(f"module {module_name!r} is not imported: {NOT_IMPORTED}")
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def exception_class(entry: object, *, imports: bool = True) -> type[BaseException]:
    """The exception class a ``retry_on`` entry names; ValueError says why there is none.

    An entry is an exception class, the name of a built-in exception, or an importable
    ``package.module.ClassName`` (or ``package.module:ClassName``) path. With
    ``imports=False`` (flow files) a path is found only in modules already imported.
    """
    if isinstance(entry, type):
        if issubclass(entry, BaseException):
            return entry
        raise ValueError(f"{entry.__name__!r} is not an exception class")
    if not isinstance(entry, str):
        try:
            shown = repr(entry)[:100]
        except Exception:  # e.g. an int too long to print
            shown = f"a {type(entry).__name__}"
        raise ValueError(f"must be an exception class or class name, got {shown}")
    if entry.isidentifier():
        target = getattr(builtins, entry, None)
        if isinstance(target, type) and issubclass(target, BaseException):
            return target
        close = difflib.get_close_matches(entry, _BUILTIN_EXCEPTIONS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"{entry!r} is not an exception class ({hint}use a built-in "
                         "exception name or an importable 'package.module.ClassName')")
    if not _CLASS_PATH.fullmatch(entry):
        raise ValueError(f"{entry[:100]!r} is not an exception class name or an "
                         "importable 'package.module.ClassName'")
    try:  # what is imported already is found without importing anything
        target = imported_attribute(entry)
    except ValueError as error:
        if not imports:
            raise ValueError(f"{entry!r} is not an exception class: {error}") from None
        target = _import_class(entry)
    if isinstance(target, type) and issubclass(target, BaseException):
        return target
    raise ValueError(f"{entry!r} is not an exception class")


def _import_class(entry: str) -> Any:
    try:
        return pkgutil.resolve_name(entry)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{entry!r} is not an exception class: cannot import it "
                         f"({type(error).__name__}: {error})") from None
    except Exception as error:  # the module's own code failed while importing
        raise ValueError(f"{entry!r}: importing it failed: {type(error).__name__}: "
                         f"{error}") from None


_BUILTIN_EXCEPTIONS = sorted(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException))
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
CLASS_PATH_PATTERN = rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*(:{_IDENTIFIER}(\.{_IDENTIFIER})*)?$"
_CLASS_PATH = re.compile(CLASS_PATH_PATTERN)


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failing step is tried again, and how long to wait in between.

    Attempt ``n`` (from 1) that fails waits ``backoff_seconds * 2 ** (n - 1)`` seconds,
    at most ``max_backoff_seconds``, each wait scaled by a random factor in
    ``[1 - jitter, 1 + jitter]``. Only failures whose exception class (or a base class)
    is in ``retry_on`` are retried; per-attempt timeouts are ``TimeoutError``. Each
    ``retry_on`` entry is an exception class, the name of a built-in exception
    (``"ConnectionError"``) or an importable path (``"package.module.ClassName"`` or
    ``"package.module:ClassName"``); anything else is a :class:`DefinitionError`, so a
    misspelt name fails when the flow is defined instead of never retrying.
    Retries only ever apply to steps whose tool is idempotent.
    """

    max_attempts: int = 3
    backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0
    jitter: float = 0.0
    retry_on: Sequence[str | type[BaseException]] = ("Exception",)
    _classes: tuple[type[BaseException], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise DefinitionError(f"retry: max_attempts must be an integer from 1 to "
                                  f"{MAX_ATTEMPTS}")
        for name in ("backoff_seconds", "max_backoff_seconds"):
            value = getattr(self, name)
            # "not 0 <= value <= max" also rejects NaN and infinity.
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value <= MAX_BACKOFF_SECONDS:
                raise DefinitionError(f"retry: {name} must be a number of seconds from 0 "
                                      f"to {MAX_BACKOFF_SECONDS}")
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, (int, float)) \
                or not 0 <= self.jitter <= 1:
            raise DefinitionError("retry: jitter must be a number from 0 to 1")
        retry_on = self.retry_on
        if not isinstance(retry_on, (str, type, list, tuple, set, frozenset)):
            raise DefinitionError(f"retry: retry_on must be a list of exception classes or "
                                  f"class names, got {type(retry_on).__name__}")
        entries: list[str | type[BaseException]] = []
        classes: list[type[BaseException]] = []
        items = [retry_on] if isinstance(retry_on, (str, type)) else list(retry_on)
        for index, item in enumerate(items):
            try:
                cls = exception_class(item)
            except ValueError as error:
                raise DefinitionError(f"retry: retry_on[{index}]: {error}") from None
            # Names and paths are kept as written, built-in classes by name, others as is.
            entries.append(cls.__name__ if item is cls
                           and getattr(builtins, cls.__name__, None) is cls else item)
            classes.append(cls)
        if not entries:
            raise DefinitionError("retry: retry_on must name at least one exception class")
        object.__setattr__(self, "retry_on", tuple(entries))
        object.__setattr__(self, "_classes", tuple(classes))

    def retries(self, error: BaseException) -> bool:
        """Whether ``error`` is one this policy retries: an instance of a class in
        ``retry_on`` (subclasses included).

        A failed sub-flow attempt (an exception with an ``error_type``) also matches the
        error its run ended with: a built-in exception by its classes, another by its
        class name. ``retry_on=["TimeoutError"]`` retries a sub-flow step that timed out.
        """
        if isinstance(error, self._classes):
            return True
        inner = getattr(error, "error_type", None)
        if not isinstance(inner, str):
            return False
        builtin = getattr(builtins, inner, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return issubclass(builtin, self._classes)
        return any(cls.__name__ == inner for cls in self._classes)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        # Doubling past the cap is pointless (and 2 ** n overflows a float eventually).
        base = min(self.backoff_seconds * 2.0 ** min(attempt - 1, 64),
                   self.max_backoff_seconds)
        if self.jitter:
            base *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return base
