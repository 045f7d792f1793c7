"""Plain attributes for FastMCP components, which are pydantic models.

A pydantic private attribute (``PrivateAttr``) is found by the model's ``__getattr__``
only after the ordinary lookup raised an ``AttributeError``: about 17.8 k instructions
a read, and a flow tool read a dozen of them per call. A component keeps what it serves
by in ``__slots__`` instead (plain attribute reads). Pydantic's copies (``model_copy``:
a ``Namespace`` renames a tool by copying it) know nothing of slots; :class:`PlainSlots`
carries them over, shared, as pydantic shares its private attributes' values.
"""

from __future__ import annotations

from typing import Any

# What type checkers see a slot start as (``if TYPE_CHECKING: _x: T = SET_BY_BUILD``):
# a default, so they do not take the slot for a constructor argument. At run time the
# annotation is left out (pydantic would make it a private attribute again), and the
# component's ``build`` sets every slot.
SET_BY_BUILD: Any = None


class PlainSlots:
    """Mixin (first base) for a component whose own ``__slots__`` hold what it serves by."""

    __slots__ = ()

    def __copy__(self) -> Any:
        copied = super().__copy__()  # type: ignore[misc]
        _carry(self, copied)
        return copied

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        copied = super().__deepcopy__(memo)  # type: ignore[misc]
        _carry(self, copied)  # an executor or a store is shared, never copied
        return copied


def set_slots(component: object, **values: Any) -> None:
    """Set ``component``'s own slots: what pydantic's ``__setattr__`` ends in for a name
    that is no field (``object.__setattr__``), without its checks on the way, about a
    quarter of building a flow tool."""
    for name, value in values.items():
        object.__setattr__(component, name, value)


def _carry(source: object, target: object) -> None:
    for klass in type(source).__mro__:
        if klass is PlainSlots or not issubclass(klass, PlainSlots):
            continue
        for name in klass.__dict__.get("__slots__", ()):
            try:
                value = object.__getattribute__(source, name)
            except AttributeError:  # never set
                continue
            object.__setattr__(target, name, value)
