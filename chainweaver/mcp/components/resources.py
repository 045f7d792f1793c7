"""Schema resources: each exposed flow's contract as a readable, cacheable JSON document.

``chainweaver://flows/{published_name}/schema`` holds the flow's name, version,
title, description, tool name and the exact input/output JSON Schemas its tool
advertises; ``chainweaver://flows`` indexes every exposed flow.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from fastmcp.resources.base import Resource, ResourceResult
from fastmcp.resources.template import ResourceTemplate
from mcp_types import Annotations

from chainweaver.mcp.components.plain_slots import SET_BY_BUILD, PlainSlots
from chainweaver.mcp.publish.exposure import INDEX_URI, ExposedFlow, schema_uri

TEMPLATE_URI = schema_uri("{published_name}")
MIME_TYPE = "application/json"
# Clients load the index first, then the schemas they need.
INDEX_ANNOTATIONS = Annotations(audience=["assistant", "user"], priority=0.9)
SCHEMA_ANNOTATIONS = Annotations(audience=["assistant", "user"], priority=0.7)


def schema_document(exposed: ExposedFlow) -> dict[str, Any]:
    flow = exposed.flow
    return {
        "name": flow.name,
        "version": flow.version,
        "title": flow.display_title,
        "description": flow.description,
        "tool_name": exposed.tool_name,
        "input_schema": exposed.contract.input_schema,
        "output_schema": exposed.contract.output_schema,
    }


def index_document(flows: Iterable[ExposedFlow]) -> dict[str, Any]:
    """The index of ``flows`` (what one caller's view holds)."""
    return {
        "flows": [
            {
                "name": exposed.flow.name,
                "tool_name": exposed.tool_name,
                "version": exposed.flow.version,
                "title": exposed.flow.display_title,
                "description": exposed.flow.description,
                "read_only": bool(exposed.safety and exposed.safety.read_only),
                "schema_uri": exposed.schema_uri,
                "prompts": exposed.prompt_names,
            }
            for exposed in flows
        ]
    }


def _json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False)


class JSONDocumentResource(PlainSlots, Resource):
    """A resource whose JSON text is produced once, on first read."""

    __slots__ = ("_text", "_produce")  # plain attributes: a read uses them (plain_slots.py)
    if TYPE_CHECKING:
        _text: str | None = SET_BY_BUILD
        _produce: Any = SET_BY_BUILD

    @classmethod
    def build(cls, produce: Any, **fields: Any) -> JSONDocumentResource:
        resource = cls(mime_type=MIME_TYPE, **fields)
        resource._produce = produce
        resource._text = None
        return resource

    async def read(self) -> ResourceResult:
        if self._text is None:
            self._text = _json(self._produce())
        return ResourceResult(self._text, meta=None)

    def convert_result(self, raw_value: Any) -> ResourceResult:
        if isinstance(raw_value, ResourceResult):
            # Keep the advertised MIME type on every content block.
            for content in raw_value.contents:
                content.mime_type = MIME_TYPE
            return raw_value
        return super().convert_result(raw_value)


def schema_resource(exposed: ExposedFlow) -> JSONDocumentResource:
    assert exposed.schema_uri is not None
    flow = exposed.flow
    return JSONDocumentResource.build(
        lambda: schema_document(exposed),
        uri=exposed.schema_uri,
        name=f"{exposed.tool_name}_schema",
        title=f"{flow.display_title} schema",
        description=(f"Input and output JSON Schema of the {exposed.tool_name!r} tool "
                     f"(flow {flow.name!r} v{flow.version})."),
        annotations=SCHEMA_ANNOTATIONS,
        meta={"chainweaver": {"flow": flow.name, "version": flow.version}},
    )


def index_resource(flows: Callable[[], Iterable[ExposedFlow]]) -> JSONDocumentResource:
    return JSONDocumentResource.build(
        lambda: index_document(flows()),
        uri=INDEX_URI,
        name="chainweaver_flows",
        title="Published flows",
        description="Every flow this server publishes: tool name, version, title, schema "
                    "resource and prompts.",
        annotations=INDEX_ANNOTATIONS,
    )


class SchemaTemplate(ResourceTemplate):
    """``chainweaver://flows/{published_name}/schema``: reads resolve only exposed flows.

    Concrete schema resources answer every exposed URI first, so this template is
    advertised for discovery and completion; a read that reaches it for any other
    name finds nothing and gets FastMCP's ordinary not-found answer.
    """

    @classmethod
    def build(cls) -> SchemaTemplate:
        return cls(
            uri_template=TEMPLATE_URI,
            name="flow_schema",
            title="Flow schema",
            description="Input and output JSON Schema of a published flow tool, by its "
                        "published name.",
            mime_type=MIME_TYPE,
            parameters={"type": "object", "properties": {"published_name": {"type": "string"}},
                        "required": ["published_name"]},
            annotations=SCHEMA_ANNOTATIONS,
        )
