"""The published URIs of run records: ``chainweaver://runs`` (a caller's runs),
``chainweaver://runs/{run_id}`` (one record) and ``chainweaver://runs/{run_id}/output``
(an output too large for its result), beside the other published names.

Under a composition (a ``Namespace`` on the server, ``mount_into`` a parent) clients
reach them elsewhere, at the *root* the composition gives ``chainweaver://runs``
(``chainweaver://shop/runs`` under ``Namespace("shop")``): every function here takes
that root, the server's own by default.
"""

from __future__ import annotations

RUNS_URI = "chainweaver://runs"


def is_run_uri(uri: str, root: str = RUNS_URI) -> bool:
    """Whether ``uri`` is a run resource's (``chainweaver://runs...``, or the same
    under ``root``)."""
    return uri == root or uri.startswith((root + "/", root + "?"))


def run_uri(run_id: str, root: str = RUNS_URI) -> str:
    return f"{root}/{run_id}"


def output_uri(run_id: str, root: str = RUNS_URI) -> str:
    return f"{root}/{run_id}/output"
