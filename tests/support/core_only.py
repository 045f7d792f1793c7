"""Running code as a core-only install (``pip install -e .``) would: the standard
library, pydantic with what it needs, and chainweaver import; every extra's package
(fastmcp, mcp, anyio, redis, yaml, opentelemetry, ...) is missing, as it would be.

A ``sitecustomize`` module on ``PYTHONPATH`` puts a finder first on ``sys.meta_path``
that answers ``No module named ...`` for any other installed top-level package.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The installed packages a core-only install has: itself, pydantic and what it needs.
CORE = ("chainweaver", "pydantic", "pydantic_core", "annotated_types", "typing_extensions",
        "typing_inspection")

BLOCKER = f'''\
import sys
from importlib.machinery import PathFinder

CORE = set({CORE!r})


class CoreOnly:
    """Any installed package but the core's cannot be imported; the standard library
    and modules outside site-packages (the project, the user's own) can."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in CORE or top in sys.stdlib_module_names or name != top:
            return None
        found = PathFinder.find_spec(top)
        where = (found.origin or "") if found is not None else ""
        if found is not None and found.submodule_search_locations:
            where = " ".join(found.submodule_search_locations)
        if "-packages" in where:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, CoreOnly())
'''


def core_only_env(directory: Path) -> dict[str, str]:
    """The environment of a subprocess that imports as a core-only install does (the
    blocker is written into ``directory``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(BLOCKER)
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHONPATH": str(directory),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
