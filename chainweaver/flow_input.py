"""The input model a flow without ``input_schema`` takes: its first step's.

:func:`derived_input_model`: the flow takes its first step's input fields; fields that
step feeds with a constant, a pointer or another context key are not asked of the
caller; the keys it reads instead are (a renamed key typed like its field; a pointer's
top-level key as an object holding the pointed-to path, typed like the field it feeds).
Derived models are named after the flow that takes them: a flow starting with a
sub-flow derives the sub-flow's model again under its own name, so its published schema
never names a sub-flow (one its callers may not see).
"""

from __future__ import annotations

import json
import keyword
import weakref
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from .flows import Flow
from .inline_schema import InlineModel, model_from_json_schema
from .mappings import Const, Pointer
from .schemas import field_annotation

_DERIVED: dict[tuple[Any, ...], type[BaseModel]] = {}
_MAX_DERIVED = 4096  # flows reloaded by a watcher must not grow this without bound


def derived_input_model(flow: Flow, base: type[BaseModel]) -> type[BaseModel]:
    """``base`` (the first step's input model) as the flow's input: see the module doc.

    Returns ``base`` itself when the first step maps no constant or pointer, so flows
    that use neither keep publishing exactly what they did; a model derived for a
    sub-flow the flow starts with is derived again under the flow's own name (see
    :func:`_named_for`).
    """
    base = _named_for(flow.name, base)
    mapping = flow.steps[flow.order[0]].input_mapping
    special = {name: source for name, source in mapping.items()
               if name in base.model_fields and source != name
               and (not isinstance(source, str) or _identifier(source))}
    if not special:
        return base
    return _derived(flow.name, base, special)


def _derived(flow_name: str, base: type[BaseModel],
             special: dict[str, str | Const | Pointer]) -> type[BaseModel]:
    signature = json.dumps([(name, source if isinstance(source, str) else
                             source.path if isinstance(source, Pointer) else None)
                            for name, source in sorted(special.items())])
    key = (flow_name, base, signature)
    model = _DERIVED.get(key)
    if model is None:
        if len(_DERIVED) >= _MAX_DERIVED:
            _DERIVED.clear()
        model = _DERIVED[key] = _derive(flow_name, base, special)
        _ORIGIN[model] = (base, special)
    return model


# A derived model -> what it was derived from (the base and the fields fed specially),
# for as long as the model lives: how to derive it again under another flow's name.
_ORIGIN: weakref.WeakKeyDictionary[type[BaseModel], tuple[type[BaseModel], dict[str, Any]]] \
    = weakref.WeakKeyDictionary()


def _named_for(flow_name: str, model: type[BaseModel]) -> type[BaseModel]:
    """``model`` as ``flow_name``'s input. A flow that starts with a sub-flow takes the
    sub-flow's input model; one derived for the sub-flow is named after it (its title,
    and its nested models' names, are in the published schema), and the sub-flow may
    be one the flow's callers cannot see. So it is derived again, nested models and
    all, under this flow's name: what a flow publishes never names a sub-flow it runs.
    """
    origin = _ORIGIN.get(model)
    if origin is None or model.__name__ == _model_name(flow_name):
        return model
    base, special = origin
    return _derived(flow_name, _named_for(flow_name, base), special)


def _model_name(flow_name: str) -> str:
    parts = flow_name.replace("-", "_").replace(".", "_").split("_")
    return "".join(part.capitalize() for part in parts if part) + "Input"


def _pointer_tree(base: type[BaseModel], special: Mapping[str, str | Const | Pointer]
                  ) -> dict[str, Any]:
    """Root field -> nested dict of tokens, whose leaves are the fed field's name."""
    tree: dict[str, Any] = {}
    for name, source in special.items():
        if not isinstance(source, Pointer) or source.root in base.model_fields \
                or not _identifier(source.root):
            continue  # the base already asks for it, or no field can carry that name
        node = tree
        tokens = source.tokens
        for token in tokens[:-1]:
            child = node.get(token)
            if not isinstance(child, dict):
                child = node[token] = {} if child is None else {"": child}
            node = child
        if tokens[-1] not in node:
            node[tokens[-1]] = name
    return tree


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) \
        and not name.startswith(("_", "model_"))


def _derive(flow_name: str, base: type[BaseModel],
            special: Mapping[str, str | Const | Pointer]) -> type[BaseModel]:
    name = _model_name(flow_name)
    tree = _pointer_tree(base, special)
    if issubclass(base, InlineModel):
        return _derive_inline(name, base, special, tree)
    fields: dict[str, Any] = {field: (info.annotation, info)
                              for field, info in base.model_fields.items()
                              if field not in special}
    for field, key in special.items():
        if isinstance(key, str) and key not in fields:  # a rename: the caller gives key
            fields[key] = (base.model_fields[field].annotation, base.model_fields[field])
    for root, node in tree.items():
        fields[root] = (_nested_type(base, node, f"{name}{root.title()}"), ...)
    return create_model(name, __config__=ConfigDict(**base.model_config),
                        **fields)


def _nested_type(base: type[BaseModel], node: Any, name: str) -> Any:
    """The type of one level of the pointer tree: the fed field's type at a leaf, an
    object (keeping fields nobody points at) above it."""
    if isinstance(node, str):
        return field_annotation(base, node)
    if "" in node or not all(_identifier(token) for token in node):
        return Any  # a level both read whole and walked into, or keys no field can name
    fields: dict[str, Any] = {token: (_nested_type(base, child, f"{name}{token.title()}"), ...)
              for token, child in node.items()}
    return create_model(name, __config__=ConfigDict(extra="allow"), **fields)


def _derive_inline(name: str, base: type[InlineModel], special: Mapping[str, Any],
                   tree: dict[str, Any]) -> type[BaseModel]:
    schema = json.loads(json.dumps(base._json_schema))
    properties = schema.setdefault("properties", {})
    for field in special:
        properties.pop(field, None)
    required = [r for r in schema.get("required", []) if r not in special]
    original = base._json_schema.get("properties", {})

    def nested(node: Any) -> dict[str, Any]:
        if isinstance(node, str):
            return json.loads(json.dumps(original.get(node, {})))
        if "" in node or not all(_identifier(token) for token in node):
            return {}
        return {"type": "object", "properties": {t: nested(c) for t, c in node.items()},
                "required": list(node)}

    for field, key in special.items():
        if isinstance(key, str) and key not in properties:
            properties[key] = json.loads(json.dumps(original.get(field, {})))
            if field in base._json_schema.get("required", []):
                required.append(key)
    for root, node in tree.items():
        properties[root] = nested(node)
        required.append(root)
    schema["required"] = required
    return model_from_json_schema(schema, name)
