"""Idempotency keys: a tool that declares an :data:`IdempotencyKey` parameter gets a
key that names one step of one run, the same on every attempt and every redelivery of
that run, so the tool can make its effect happen once (pass it to the service it
calls, or remember it).

The key is injected by the step runner and is never part of a tool's input model, so
no schema (the tool's, a flow's, anything published) ever shows it and no caller can
set it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel


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
