"""``chainweaver inspect``'s prompt section: each published prompt with its arguments
and its messages rendered with placeholder values, and the prompts the prompt policy
withholds, with why."""

from __future__ import annotations

import textwrap
from typing import Any


def format_prompts(server: Any) -> list[str]:
    """The lines of the prompt section (none when the server publishes no prompts and
    withholds none)."""
    templates = server.prompt_templates()
    withheld = [(entry.flow_name, name, why) for entry in server.exposure_report()
                for name, why in entry.withheld_prompts]
    if not templates and not withheld:
        return []
    lines = ["", f"Prompts: {len(templates)} published"]
    for template in templates:
        owner = f", flow {template['flow']}" if template["flow"] else ""
        lines.append(f"  {template['name']} ({template['kind']}{owner})")
        for argument in template["arguments"]:
            required = "required" if argument["required"] else "optional"
            about = f": {argument['description']}" if argument["description"] else ""
            lines.append(f"    argument {argument['name']} ({required}){about}")
        for message in template["messages"]:
            lines.append(f"    [{message['role']}]")
            lines += [textwrap.indent(line, "      ") if line else ""
                      for line in message["text"].splitlines()]
    if withheld:
        lines += ["", f"Prompts withheld by the prompt policy: {len(withheld)}"]
        lines += [f"  {name} (flow {flow}): {why}" for flow, name, why in withheld]
    return lines
