"""The optional extras: what installs them, and which of their packages are in use.

ChainWeaver is installed from a clone of its repository. The ``chainweaver`` on the
public package index is another project (the reference package), so every install
instruction this package prints names the clone form.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

# The packages of each extra a user would ask about, as (import name, distribution).
EXTRA_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "mcp": (("fastmcp", "fastmcp"), ("mcp", "mcp")),
    "tasks": (("fastmcp_tasks", "fastmcp-tasks"), ("redis", "redis")),
    "yaml": (("yaml", "pyyaml"),),
}


def install_hint(*extras: str) -> str:
    """The command that installs ``extras``, as every message of this package says it."""
    return f"pip install -e '.[{','.join(extras)}]' in a clone of ChainWeaver"


def needs_extra(what: str, *extras: str) -> str:
    """One line saying that ``what`` needs ``extras`` and how to install them."""
    names = " and ".join(f"the {extra} extra" for extra in extras)
    return f"{what} needs {names}: {install_hint(*extras)}"


def installed_version(module: str, distribution: str) -> str | None:
    """The version of ``distribution`` when ``module`` can be imported here (None when it
    cannot). Looks the module up without importing it: cheap enough for ``--version``."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def version_report() -> str:
    """What ``chainweaver --version`` prints: ChainWeaver's version, then each extra's
    packages with the version in use, or "not installed"."""
    from . import __version__  # defined once the package's own imports (this one) ran

    lines = [f"chainweaver {__version__}"]
    for extra, packages in EXTRA_PACKAGES.items():
        for module, distribution in packages:
            version = installed_version(module, distribution)
            lines.append(f"{distribution} {version or 'not installed'} ({extra} extra)")
    return "\n".join(lines)
