"""Typed tools: a Python function with a pydantic input model and (optionally) an output model."""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import UnionType
from typing import (
    Annotated,
    Any,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)

from pydantic import (
    BaseModel,
    PydanticSchemaGenerationError,
    PydanticUndefinedAnnotation,
    PydanticUserError,
    create_model,
)

from .errors import DefinitionError, InvalidNameError
from .grants import Grants
from .safety import ToolSafetyContract

# ------------------------------------------------------ idempotency keys
#
# Idempotency keys: a tool that declares an :data:`IdempotencyKey` parameter gets a
# key that names one step of one run, the same on every attempt and every redelivery of
# that run, so the tool can make its effect happen once (pass it to the service it
# calls, or remember it).
#
# The key is injected by the step runner and is never part of a tool's input model, so
# no schema (the tool's, a flow's, anything published) ever shows it and no caller can
# set it.


class _KeyMarker:
    """Marks the :data:`IdempotencyKey` annotation."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IDEMPOTENCY_KEY"


KEY_MARKER = _KeyMarker()

#: Declare a tool parameter of this type to receive the step's idempotency key:
#: 32 hex characters, stable per (run, step) and different across steps and runs.
IdempotencyKey = Annotated[str, KEY_MARKER]


def is_key_annotation(hint: Any) -> bool:
    """Whether a resolved type hint is :data:`IdempotencyKey`."""
    return get_origin(hint) is Annotated and any(
        meta is KEY_MARKER for meta in get_args(hint)[1:])


@dataclass(frozen=True, slots=True)
class Keyed:
    """What a tool that takes a key is called with: its validated input and the key."""

    model: BaseModel
    key: str


def step_key(scope: str, path: str) -> str:
    """The key of step ``path`` (a step id; a sub-flow's steps and fallbacks extend it)
    in the run ``scope`` names. Hashed: fixed length, and nothing of the run's id."""
    return hashlib.sha256(f"{scope}\x1f{path}".encode()).hexdigest()[:32]


NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # whole string: use fullmatch


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid MCP tool name, else raise :class:`InvalidNameError`."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidNameError(
            f"{kind} name {name!r} is invalid: use 1-64 characters from "
            "letters, digits, '_', '-' and '.'"
        )
    return name


def _is_model_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel


def check_model(owner: str, label: str, value: object, *, optional: bool = False) -> None:
    """Raise :class:`DefinitionError` unless ``value`` is a complete pydantic model class.

    A model whose annotations cannot be resolved yet would otherwise fail much later,
    when a server first builds its JSON Schema, far from the code that caused it.
    """
    if value is None and optional:
        return
    if not _is_model_class(value):
        suffix = " or None" if optional else ""
        raise DefinitionError(f"{owner}: {label} must be a pydantic model class{suffix}"
                              + (" (a subclass of BaseModel, not BaseModel itself)"
                                 if value is BaseModel else ""))
    model = cast("type[BaseModel]", value)
    if model.__pydantic_complete__:
        return
    try:
        model.model_rebuild()
    except (PydanticUserError, PydanticUndefinedAnnotation) as error:
        raise DefinitionError(
            f"{owner}: {label} {model.__name__} is not fully defined: {error.message}"
        ) from None


class Tool:
    """A named, typed function a flow step can call.

    ``fn`` receives an instance of ``input_schema`` and returns a dict or a model
    instance; it may be sync or async. ``output_schema`` is ``None`` when the output
    shape is not declared (the output must then still be a dict).

    ``takes_key=True``: ``fn(model, key)`` also receives the step's idempotency key
    (see :data:`chainweaver.IdempotencyKey`); the key is never part of ``input_schema``.

    ``requires``: what a flow's caller must hold for a step to call this tool (scopes,
    claims; see :class:`~chainweaver.grants.Grants` and ``docs/step-grants.md``).
    ``blocking=False`` declares a sync ``fn`` that never blocks (no I/O, no sleep, no
    long computation): ``execute_flow_async`` then calls it on the event loop instead
    of in a worker thread, which saves the thread hop. Every other sync tool runs off
    the loop. Ignored for an async ``fn``.
    """

    __slots__ = ("name", "description", "input_schema", "output_schema", "fn",
                 "safety", "is_async", "input_fields", "takes_key", "requires", "blocking")

    def __init__(
        self,
        name: str,
        description: str,
        input_schema: type[BaseModel],
        output_schema: type[BaseModel] | None,
        fn: Callable[..., Any],
        safety: ToolSafetyContract | None = None,
        *,
        takes_key: bool = False,
        requires: Grants | Iterable[str] | Mapping[str, Any] | None = None,
        blocking: bool = True,
    ) -> None:
        self.name = check_name("tool", name)
        self.requires = Grants.of(requires, f"tool {name!r}: requires")
        check_model(f"tool {name!r}", "input_schema", input_schema)
        check_model(f"tool {name!r}", "output_schema", output_schema, optional=True)
        if not callable(fn):
            raise DefinitionError(f"tool {name!r}: fn must be callable")
        if safety is not None and not isinstance(safety, ToolSafetyContract):
            raise DefinitionError(f"tool {name!r}: safety must be a ToolSafetyContract")
        if not isinstance(blocking, bool):
            raise DefinitionError(f"tool {name!r}: blocking must be True or False")
        self.description = description or ""
        self.input_schema = input_schema
        self.output_schema = output_schema
        self.safety = safety
        self.is_async = inspect.iscoroutinefunction(fn)
        self.input_fields: tuple[str, ...] = tuple(input_schema.model_fields)
        self.takes_key = bool(takes_key)
        # Only a sync function can block the event loop: an async one never does here.
        self.blocking = blocking and not self.is_async
        # The lanes call fn with one argument: a keyed tool's is a Keyed (the runner's).
        self.fn: Callable[[Any], Any] = _unpacking(fn, self.is_async) if self.takes_key else fn

    @property
    def rerunnable(self) -> bool:
        """May a call that was interrupted be made again: idempotent, or keyed."""
        return self.takes_key or bool(self.safety is not None and self.safety.idempotent)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r})"


def _unpacking(fn: Callable[..., Any], is_async: bool) -> Callable[[Keyed], Any]:
    if is_async:
        async def call_async(keyed: Keyed) -> Any:
            return await fn(keyed.model, keyed.key)
        return call_async

    def call_sync(keyed: Keyed) -> Any:
        return fn(keyed.model, keyed.key)
    return call_sync


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return inspect.cleandoc(doc).split("\n\n", 1)[0].replace("\n", " ").strip()


def _tool_from_function(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    output_schema: type[BaseModel] | None,
    safety: ToolSafetyContract | None,
    requires: Any = None,
    blocking: bool = True,
) -> Tool:
    tool_name = name or getattr(fn, "__name__", None)
    if tool_name is None:  # a functools.partial, a callable object: nothing to name it by
        raise DefinitionError(f"cannot name a tool for {fn!r}: pass name=")
    try:
        hints = get_type_hints(fn, include_extras=True)
    except NameError as error:  # e.g. a string annotation naming a class local to a function
        raise DefinitionError(
            f"tool {tool_name!r}: cannot resolve the type hints ({error}); "
            "define the annotated classes at module level"
        ) from error
    except TypeError:  # a functools.partial, a callable object: no hints to read
        raise DefinitionError(f"tool {tool_name!r}: cannot read the type hints of "
                              f"{type(fn).__name__} {fn!r}; make the tool a function "
                              "(def or async def)") from None
    params = list(inspect.signature(fn).parameters.values())
    returned = hints.get("return")
    _check_return(tool_name, returned, output_schema)
    if output_schema is None and _is_model_class(returned):
        output_schema = returned
    # The key is injected, never an input field: it is left out of the model.
    keys = [p.name for p in params if is_key_annotation(hints.get(p.name))]
    if len(keys) > 1:
        raise DefinitionError(f"tool {tool_name!r}: only one parameter may be an "
                              f"IdempotencyKey, got {', '.join(keys)}")
    key = keys[0] if keys else None
    params = [p for p in params if p.name != key]

    # A single parameter annotated with a model: that model is the input schema.
    if len(params) == 1 and _is_model_class(hints.get(params[0].name)):
        single = fn
        if key is not None:
            single = _keyword_key(fn, key)
        return Tool(tool_name, description or _first_paragraph(fn.__doc__),
                    hints[params[0].name], output_schema, single, safety,
                    takes_key=key is not None, requires=requires, blocking=blocking)

    fields: dict[str, Any] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise DefinitionError(f"tool {tool_name!r}: *args/**kwargs are not supported")
        if param.kind is param.POSITIONAL_ONLY:  # the tool is called with keywords
            raise DefinitionError(f"tool {tool_name!r}: parameter {param.name!r} is "
                                  "positional-only; a tool's fields are passed by name "
                                  "(remove the '/')")
        if param.name not in hints:
            raise DefinitionError(
                f"tool {tool_name!r}: parameter {param.name!r} needs a type hint"
            )
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], default)
    model_name = "".join(part.title() for part in re.split(r"[_.-]", tool_name)) + "Input"
    input_model = _input_model(tool_name, model_name, fields)
    names = tuple(fields)

    call: Callable[..., Any]
    if key is not None:
        call = _splatting_keyed(fn, names, key)
    else:
        async def call_async(model: BaseModel) -> Any:
            return await fn(**{n: getattr(model, n) for n in names})

        def call_sync(model: BaseModel) -> Any:
            return fn(**{n: getattr(model, n) for n in names})

        call = call_async if inspect.iscoroutinefunction(fn) else call_sync
    return Tool(tool_name, description or _first_paragraph(fn.__doc__),
                input_model, output_schema, call, safety, takes_key=key is not None,
                requires=requires, blocking=blocking)


def _input_model(tool_name: str, model_name: str, fields: dict[str, Any]
                 ) -> type[BaseModel]:
    """The input model of a tool's parameters; a parameter pydantic cannot take as a
    field (an annotation it has no schema for, a reserved name) is named, never a
    pydantic traceback or a field silently dropped."""
    for name, spec in fields.items():
        try:
            single = create_model(model_name, **{name: spec})
        except Exception as error:  # pydantic raises several types for one field
            if hasattr(BaseModel, name):
                first = "the name is taken by pydantic's BaseModel; rename it"
            elif isinstance(error, PydanticSchemaGenerationError):
                first = ("pydantic cannot validate it or describe it in JSON Schema (use "
                         "JSON types, or a pydantic model)")
            else:
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DefinitionError(f"tool {tool_name!r}: parameter {name!r} (annotated "
                                  f"{_shown_hint(spec[0])}) cannot be an input field: "
                                  f"{first}") from None
        if name not in single.model_fields:  # '_x': pydantic makes it private, not a field
            raise DefinitionError(f"tool {tool_name!r}: parameter {name!r} cannot be an "
                                  "input field: a name starting with '_' is private to "
                                  "pydantic; rename it")
    return create_model(model_name, **fields)


def _shown_hint(hint: Any) -> str:
    if hint is type(None):
        return "None"
    return hint.__qualname__ if isinstance(hint, type) else repr(hint)


def _check_return(tool_name: str, returned: Any, output_schema: Any) -> None:
    """A return annotation that can be neither a dict nor a model would fail every call
    at run time: say so when the tool is defined."""
    if output_schema is not None or returned is None or returned is Any:
        return
    kind = get_origin(returned) or returned
    if kind in (Union, UnionType):
        return  # one of them may fit; the output is checked when it comes
    if kind is type(None) or (isinstance(kind, type)
                              and not issubclass(kind, (Mapping, BaseModel))):
        raise DefinitionError(f"tool {tool_name!r}: returns {_shown_hint(returned)} by its "
                              "annotation, but a tool returns a dict or a pydantic model "
                              "(annotate -> dict, or return a model)")


def _keyword_key(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
    """``fn(model, key=...)`` as ``call(model, key)`` (a tool taking one model)."""
    if inspect.iscoroutinefunction(fn):
        async def call_async(model: BaseModel, value: str) -> Any:
            return await fn(model, **{key: value})
        return call_async

    def call_sync(model: BaseModel, value: str) -> Any:
        return fn(model, **{key: value})
    return call_sync


def _splatting_keyed(fn: Callable[..., Any], names: tuple[str, ...], key: str
                     ) -> Callable[..., Any]:
    """``fn(field=..., key=...)`` as ``call(model, key)``."""
    if inspect.iscoroutinefunction(fn):
        async def call_async(model: BaseModel, value: str) -> Any:
            return await fn(**{n: getattr(model, n) for n in names}, **{key: value})
        return call_async

    def call_sync(model: BaseModel, value: str) -> Any:
        return fn(**{n: getattr(model, n) for n in names}, **{key: value})
    return call_sync


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    output_schema: type[BaseModel] | None = None,
    safety: ToolSafetyContract | None = None,
    requires: Any = None,
    blocking: bool = True,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    output_schema: type[BaseModel] | None = None,
    safety: ToolSafetyContract | None = None,
    requires: Any = None,
    blocking: bool = True,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a type-hinted function into a :class:`Tool`.

    The input model is built from the parameters (or is the parameter's own model
    when the function takes a single pydantic model); the output model comes from a
    pydantic return annotation or ``output_schema=``. The description defaults to
    the docstring's first paragraph. Usable as ``@tool`` or ``@tool(...)``.
    ``requires`` declares the grants a flow's caller must hold to run it (a list of
    scopes, ``{"scopes": [...], "claims": {...}}`` or a
    :class:`~chainweaver.grants.Grants`). ``blocking=False``: a sync function that
    never blocks runs on the event loop in ``execute_flow_async`` (see :class:`Tool`).
    """

    def build(function: Callable[..., Any]) -> Tool:
        return _tool_from_function(function, name, description, output_schema, safety,
                                   requires, blocking)

    return build(fn) if fn is not None else build
