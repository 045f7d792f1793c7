"""The rooms of ``chainweaver/mcp/`` import only downward, in the order README.md's
"Project layout" lists them, and the package has no import circle.

The order is read from the README (its ``text`` block under "Project layout"), so the
README and this check cannot disagree. Every import counts, wherever it stands: at the
top of a module, inside a function, or under ``TYPE_CHECKING``. Within a room, modules
have no documented order; there only circles are refused.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "chainweaver"
MCP = PACKAGE / "mcp"


def documented_order() -> list[str]:
    """The rooms of ``chainweaver/mcp/``, top to bottom, as README.md lists them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Project layout", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```text\nchainweaver/mcp/\n(.*?)```", section, re.DOTALL)
    assert block is not None, "README's Project layout lists the rooms of chainweaver/mcp/"
    return [line.split()[0] for line in block.group(1).splitlines() if line.strip()]


def module_name(path: Path, top: Path = ROOT) -> str:
    """The dotted name of the module at ``path`` (``top``: where the package sits)."""
    parts = list(path.relative_to(top).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(under: Path, top: Path = ROOT) -> dict[str, Path]:
    return {module_name(path, top): path for path in sorted(under.rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a module in ``known`` by module ``name``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[:len(name.split(".")) - node.level
                                         + (path.name == "__init__.py")]
                base = ".".join([*package, base] if base else package)
            # ``from package import module`` imports the module itself.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]  # a name inside a module
            if target and target != name:
                yield node.lineno, target


def room(module: str, mcp: Path = MCP) -> str:
    """The room of a module of ``chainweaver.mcp``: its folder, or its file."""
    parts = module.split(".")[2:]
    if not parts:
        return "__init__.py"
    return f"{parts[0]}/" if (mcp / parts[0]).is_dir() else f"{parts[0]}.py"


def upward_imports(order: list[str], mcp: Path = MCP, top: Path = ROOT) -> list[str]:
    """Every import of ``chainweaver.mcp`` by one of its modules that reaches a room
    above the importing module's own (the package's face, ``__init__.py``, is above
    every room): ``path:line: room imports module (its room)``."""
    known = modules(mcp, top)
    rank = {name: index for index, name in enumerate(order)}
    found = []
    for name, path in known.items():
        here = room(name, mcp)
        if here == "__init__.py":
            continue
        for line, target in imports(name, path, known):
            there = room(target, mcp)
            if there != here and rank.get(there, -1) < rank[here]:
                found.append(f"{path.relative_to(top)}:{line}: {here} imports {target} "
                             f"({there})")
    return found


def circles(under: Path, top: Path = ROOT) -> list[list[str]]:
    """The import circles among the modules ``under`` (each a strongly connected set of
    two or more modules)."""
    known = modules(under, top)
    edges = {name: sorted({target for _, target in imports(name, path, known)})
             for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:  # Tarjan's algorithm
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in edges[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == name:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for name in edges:
        if name not in index:
            visit(name)
    return found


def test_the_readme_lists_every_room_once() -> None:
    order = documented_order()
    present = {f"{path.name}/" if path.is_dir() else path.name for path in MCP.iterdir()
               if path.name not in ("__init__.py", "__pycache__")
               and (path.is_dir() or path.suffix == ".py")}
    assert len(order) == len(set(order))
    assert set(order) == present


def test_the_mcp_tests_are_kept_in_the_rooms_they_test() -> None:
    """``tests/mcp/`` mirrors the package: a folder per room (tests of the server as a
    whole stay at its top), so every test folder names a room that exists."""
    rooms = {room.rstrip("/") for room in documented_order() if room.endswith("/")}
    folders = {path.name for path in (ROOT / "tests" / "mcp").iterdir()
               if path.is_dir() and path.name != "__pycache__"}
    assert folders and folders <= rooms, sorted(folders - rooms)


def test_no_folder_imports_a_folder_above_it() -> None:
    arrows = {f"{here} -> {there.rstrip(')')}" for here, there in (
        (line.split(": ", 1)[1].split(" imports ")[0], line.rsplit("(", 1)[1])
        for line in upward_imports(documented_order()))}
    assert sorted(arrows) == []


def test_no_module_imports_one_above_it() -> None:
    assert upward_imports(documented_order()) == []


def test_the_package_has_no_import_circle() -> None:
    assert circles(PACKAGE) == []


def test_the_check_sees_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """What the checks exist for: config.py importing the gate's hooks while a gate
    module imports config.py (inside a function), and a module importing the package's
    face."""
    mcp = tmp_path / "chainweaver" / "mcp"
    (mcp / "gate").mkdir(parents=True)
    for face in (mcp.parent, mcp, mcp / "gate"):
        (face / "__init__.py").write_text("")
    (mcp / "config.py").write_text("from chainweaver.mcp.gate.hooks import AuditHook\n")
    (mcp / "gate" / "hooks.py").write_text(
        "def later():\n    from chainweaver.mcp.config import X\n")
    (mcp / "gate" / "views.py").write_text("from ..  import FlowServer\n")
    order = ["gate/", "config.py"]
    assert upward_imports(order, mcp, tmp_path) == [
        "chainweaver/mcp/config.py:1: config.py imports chainweaver.mcp.gate.hooks (gate/)",
        "chainweaver/mcp/gate/views.py:1: gate/ imports chainweaver.mcp (__init__.py)"]
    assert circles(mcp.parent, tmp_path) == [
        ["chainweaver.mcp.config", "chainweaver.mcp.gate.hooks"]]
