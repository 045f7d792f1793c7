"""The published URIs of run records: ``chainweaver://runs`` (a caller's runs),
``chainweaver://runs/{run_id}`` (one record) and ``chainweaver://runs/{run_id}/output``
(an output too large for its result), beside the other published names."""

from __future__ import annotations

RUNS_URI = "chainweaver://runs"


def is_run_uri(uri: str) -> bool:
    """Whether ``uri`` is a run resource's (``chainweaver://runs...``)."""
    return uri == RUNS_URI or uri.startswith((RUNS_URI + "/", RUNS_URI + "?"))


def run_uri(run_id: str) -> str:
    return f"{RUNS_URI}/{run_id}"


def output_uri(run_id: str) -> str:
    return f"{RUNS_URI}/{run_id}/output"
