"""A flow's DAG drawn as a Mermaid flowchart (``chainweaver inspect --graph``)."""

from __future__ import annotations

from ..flows import Flow


def _mermaid_text(text: str) -> str:
    # Mermaid entity codes: labels may hold conditions with quotes and comparisons, and
    # ids may hold anything: "#" first (the codes start with it), a backtick would start
    # a markdown string, a line break would end the node; no control character (a
    # condition's string literal may hold one) reaches the terminal.
    return (text.replace("#", "#35;").replace("&", "#amp;").replace('"', "#quot;")
            .replace("<", "#lt;").replace(">", "#gt;").replace("`", "#96;")
            .replace("\r", " ").replace("\n", " ")) if text.isprintable() \
        else _mermaid_text("".join(c if c.isprintable() else " " for c in text))


def mermaid(flow: Flow) -> str:
    """The flow's DAG as a Mermaid flowchart (conditional steps are hexagons, sub-flows
    subroutines; retries, timeouts, on_error and fallbacks are noted in the label)."""
    lines = ["flowchart TD"]
    for index, step in enumerate(flow.steps):
        step_id = flow.step_ids[index]
        parts = [step_id]
        if step_id != step.name:
            parts.append(f"{'flow' if step.flow else 'tool'}: {step.name}")
        if step.when is not None:
            parts.append(f"when: {step.when}")
        if step.retry is not None:
            parts.append(f"retry: {step.retry.max_attempts} attempts")
        if step.timeout is not None:
            parts.append(f"timeout: {step.timeout} s")
        if step.on_error != "fail":
            parts.append(f"on_error: {step.on_error}"
                         + (f" ({step.fallback})" if step.fallback else ""))
        label = "<br/>".join(_mermaid_text(part) for part in parts)
        if step.flow is not None:
            shape = f'[["{label}"]]'
        elif step.when is not None:
            shape = f'{{{{"{label}"}}}}'
        else:
            shape = f'["{label}"]'
        lines.append(f"    n{index}{shape}")
    for index, deps in enumerate(flow.dependencies):
        for dep in deps:
            lines.append(f"    n{dep} --> n{index}")
    return "\n".join(lines)
