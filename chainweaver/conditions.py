"""The ``when`` language: small, safe conditions over context keys.

A condition is parsed once, when its step is built, with :func:`ast.parse` (which only
parses; nothing is compiled or run) and then checked against a short allow-list:

- names (context keys; a key that is absent reads as ``None``), except dunder names
- literals: strings, numbers, ``True``, ``False``, ``None``, and lists or tuples of them
- comparisons ``== != < <= > >=``, ``in``, ``not in``, ``is None``, ``is not None``
  (``==`` and ``!=`` treat lists and tuples with the same items as equal)
- ``and``, ``or``, ``not`` and parentheses

Anything else (calls, attributes, subscripts, arithmetic, lambdas, comprehensions,
f-strings, a syntax error) raises :class:`DefinitionError`. Evaluation walks the checked
tree with a handful of operators; it never calls ``eval`` or ``compile``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from .errors import DefinitionError

MAX_CONDITION_LENGTH = 1000

def _normal(value: Any) -> Any:
    """Tuples as lists, so a list literal equals a tuple-typed value with the same items."""
    if isinstance(value, (list, tuple)):
        return [_normal(item) for item in value]
    return value


_COMPARISONS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: lambda left, right: _normal(left) == _normal(right),
    ast.NotEq: lambda left, right: _normal(left) != _normal(right),
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda left, right: left in right,
    ast.NotIn: lambda left, right: left not in right,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_LITERAL_TYPES = (str, int, float, bool, type(None))

# A compiled node: a function of the context.
Evaluator = Callable[[Mapping[str, Any]], Any]


class ConditionError(Exception):
    """Evaluating a condition failed at run time (e.g. ``None < 3``)."""


class Condition:
    """A parsed ``when`` expression: ``names`` it reads, ``evaluate(context)`` -> bool."""

    __slots__ = ("text", "names", "_evaluate")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise DefinitionError(f"condition must be a string, got {type(text).__name__}")
        if not text.strip():
            raise DefinitionError("condition is empty")
        if len(text) > MAX_CONDITION_LENGTH:
            raise DefinitionError(f"condition is longer than {MAX_CONDITION_LENGTH} characters")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
            detail = getattr(error, "msg", None) or type(error).__name__
            raise DefinitionError(f"condition {text!r} is not valid: {detail}") from None
        names: list[str] = []
        try:
            self._evaluate = _compile(tree.body, text, names)
        except RecursionError:
            raise DefinitionError(f"condition {text!r} is nested too deeply") from None
        self.text = text
        self.names = tuple(dict.fromkeys(names))

    def evaluate(self, context: Mapping[str, Any]) -> bool:
        """True when the condition holds; :class:`ConditionError` when it cannot be decided."""
        try:
            return bool(self._evaluate(context))
        except Exception as error:  # e.g. comparing None with a number
            raise ConditionError(f"condition {self.text!r} failed: "
                                 f"{type(error).__name__}: {error}") from None

    def __repr__(self) -> str:
        return f"Condition({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Condition) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def _reject(text: str, node: ast.AST, what: str) -> DefinitionError:
    where = getattr(node, "col_offset", None)
    at = f" at column {where + 1}" if isinstance(where, int) else ""
    return DefinitionError(f"condition {text!r}: {what}{at} is not allowed (use names, "
                           "literals, comparisons, in, is None, and, or, not)")


def _literal(node: ast.expr, text: str) -> Any:
    """The value of a literal node (constants, and lists/tuples of constants)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, _LITERAL_TYPES):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
            and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) in (int, float):
        number = node.operand.value
        assert isinstance(number, (int, float))
        return -number
    if isinstance(node, (ast.List, ast.Tuple)):
        # A list stays a list: ``tags == []`` must hold for an empty list.
        items = [_literal(item, text) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    raise _reject(text, node, f"{type(node).__name__.lower()} literal")


def _compile(node: ast.expr, text: str, names: list[str]) -> Evaluator:
    if isinstance(node, ast.BoolOp):
        parts = [_compile(value, text, names) for value in node.values]
        if isinstance(node.op, ast.And):
            return lambda context: all(part(context) for part in parts)
        return lambda context: any(part(context) for part in parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        operand = _compile(node.operand, text, names)
        return lambda context: not operand(context)
    if isinstance(node, ast.Compare):
        return _compare(node, text, names)
    if isinstance(node, ast.Name):
        name = node.id
        if name.startswith("__") or name.endswith("__"):
            raise _reject(text, node, f"the dunder name {name!r}")
        names.append(name)
        return lambda context: context.get(name)
    value = _literal(node, text)
    return lambda context: value


def _compare(node: ast.Compare, text: str, names: list[str]) -> Evaluator:
    operands = [_compile(node.left, text, names)]
    operators = []
    for op, right in zip(node.ops, node.comparators, strict=True):
        if isinstance(op, (ast.Is, ast.IsNot)) and not (
                isinstance(right, ast.Constant) and right.value is None):
            raise _reject(text, right, "'is' with anything but None")
        operators.append(_COMPARISONS[type(op)])
        operands.append(_compile(right, text, names))

    def compare(context: Mapping[str, Any]) -> bool:
        left = operands[0](context)
        for function, operand in zip(operators, operands[1:], strict=True):
            right = operand(context)
            if not function(left, right):
                return False
            left = right
        return True

    return compare
