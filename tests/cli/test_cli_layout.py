"""The command line is one room: ``chainweaver/cli/`` holds a module per command and one
list of them; the engine's top level holds no command-line module; imports point from the
command line down to the engine and ``chainweaver.mcp``, never back, and in a circle
nowhere."""

from __future__ import annotations

import argparse
import ast
import inspect
from pathlib import Path

import chainweaver
from chainweaver.cli.commands import COMMANDS, build_parser

PACKAGE = Path(chainweaver.__file__).parent
CLI = PACKAGE / "cli"
# 35: step_failures.py split from runner.py, which had grown past 600 lines. Now 31: the
# engine's modules live in chainweaver/engine/ (retry.py, plan_checks.py and flow_input.py
# split from flows.py, plan.py and mapping_checks.py, which had grown past 500).
MAX_TOP_LEVEL_MODULES = 35


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """The modules ``path`` imports (relative imports made absolute; ``from a import b``
    counts ``a.b`` when that is a module of the package)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            modules = {f"{base}.{alias.name}" for alias in node.names
                       if _is_module(f"{base}.{alias.name}")}
            found.update(modules)
            if node.module is not None or len(modules) < len(node.names):
                found.add(base)
    return found


def _is_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] != "chainweaver":
        return False
    path = PACKAGE.parent.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_no_command_line_module_is_left_among_the_engine_modules() -> None:
    top_level = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert [name for name in top_level
            if name.startswith("cli") or name == "migrate_cli.py"] == []
    assert len(top_level) <= MAX_TOP_LEVEL_MODULES, top_level


def test_each_command_module_adds_its_parser_and_runs() -> None:
    for name, command in COMMANDS.items():
        assert Path(inspect.getfile(command)).parent == CLI, name
        for function in ("add_parser", "run"):
            assert callable(getattr(command, function, None)), f"{name}.{function}"
        assert list(inspect.signature(command.run).parameters) == ["args"], name


def test_the_parser_has_exactly_the_listed_commands_in_order() -> None:
    parser = build_parser()
    subcommands = next(action for action in parser._actions
                       if isinstance(action, argparse._SubParsersAction))
    assert list(subcommands.choices) == list(COMMANDS)


def test_only_the_entry_points_import_the_command_line() -> None:
    def imports_cli(path: Path) -> bool:
        return any(name == "chainweaver.cli" or name.startswith("chainweaver.cli.")
                   for name in imports(path))

    importers = sorted(module_name(path) for path in PACKAGE.rglob("*.py")
                       if CLI not in path.parents and imports_cli(path))
    assert importers == ["chainweaver.__main__"]


def test_the_command_line_imports_mcp_lazily_and_has_no_import_circle() -> None:
    graph = {module_name(path): imports(path, top_level_only=True)
             for path in CLI.glob("*.py")}
    for name, imported in graph.items():
        eager = sorted(module for module in imported
                       if module.split(".")[0] in ("fastmcp", "mcp")
                       or module.startswith("chainweaver.mcp"))
        assert eager == [], f"{name} imports {eager} when it is imported"
    # chainweaver/cli/__init__.py (main) sits on top: no module of the package imports it.
    assert [name for name, imported in graph.items() if "chainweaver.cli" in imported] == []
    inside = {name: imported & graph.keys() for name, imported in graph.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import circle: {' -> '.join([*path, name])}"
        if name in done:
            return
        for module in inside[name]:
            visit(module, (*path, name))
        done.add(name)

    for name in inside:
        visit(name, ())
