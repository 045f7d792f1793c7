"""Objects are built by construction: no module sets the attributes of a class another
module defines (``x.attr = ...``, ``setattr(x, "attr", ...)``, ``object.__setattr__``
with ``x`` not ``self`` or ``cls``). A dependency goes through a constructor or a named
factory of the module that owns the type; state an object changes is changed by a
method of its own.

Read from the source (``ast``), without running it. An attribute is resolved by its
name: the classes of the package that define it (in the class body, as a dataclass
field or in ``__slots__``, or as ``self.name = ...`` in a method). An assignment is
the writing module's own when a class of that module defines the name. Two small,
explained lists say what else may be written: the plain records some parts fill in by
design (:data:`RECORD_WRITERS`), and public attributes of other libraries' objects
(:data:`FOREIGN_ATTRIBUTES`).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "chainweaver"

# Plain mutable records (no collaborators, no behaviour of note) that a run or a request
# fills in as it goes, by design, and the modules besides their own that write them.
RECORD_WRITERS: dict[str, tuple[frozenset[str], str]] = {
    "chainweaver.results.StepRecord": (
        frozenset({"chainweaver.engine.runner", "chainweaver.engine.step_data",
                   "chainweaver.engine.durable", "chainweaver.engine.outcome"}),
        "a step's record: the runner fills it in as the step runs, a checkpoint restores "
        "it, a run that ends early settles copies of the running ones"),
    "chainweaver.engine.run_state.RunState": (
        frozenset({"chainweaver.engine.runner", "chainweaver.engine.step_data",
                   "chainweaver.engine.lanes", "chainweaver.engine.durable",
                   "chainweaver.engine.outcome"}),
        "a run's working state, shared by the parts of the engine that run it (the "
        "outcome hands the validated flow input to a first step that takes it)"),
    "chainweaver.plan.Plan": (
        frozenset({"chainweaver.run_events"}),
        "what one approval of a run covers, worked out on first use and kept with the "
        "compiled plan"),
    "chainweaver.mcp.runs.records.RunRecord": (
        frozenset({"chainweaver.mcp.runs.recording"}),
        "a run's record: its recorder fills it in as the run goes"),
    "chainweaver.mcp.gate.admission.RunNote": (
        frozenset({"chainweaver.mcp.runs.recording", "chainweaver.mcp.components.flow_tool"}),
        "what a call's run tells the gate's audit (its error type, its output's digest; "
        "the flow tool: its step decisions)"),
    "chainweaver.mcp.gate.admission.ListPage": (
        frozenset({"chainweaver.mcp.components.provider", "chainweaver.mcp.live.cursors"}),
        "the page a list request asks for: the provider notes what it cut it from, the "
        "cursor wrapper why it refuses a cursor"),
}

# Attributes no class of the package defines: other libraries' objects (module,
# attribute), each a public attribute of an object the module holds. "*": any name.
FOREIGN_ATTRIBUTES: dict[tuple[str, str], str] = {
    ("chainweaver.mcp.components.plain_slots", "*"):
        "a component's own plain slots, carried over to the copies FastMCP makes of it",
    ("chainweaver.mcp.fastmcp_seams", "*"):
        "every reach past FastMCP's and the MCP SDK's public API lives there",
    ("chainweaver.mcp.components.flow_tool", "meta"):
        "the _meta of the FastMCP ToolResult the flow tool returns",
    ("chainweaver.mcp.components.resources", "mime_type"):
        "the MIME type of the MCP contents a schema resource returns",
    ("chainweaver.mcp.gate.composition", "meta"):
        "a FastMCP component's metadata: the owner mark stamp_owner writes",
    ("chainweaver.mcp.gate.views", "__name__"):
        "the name of a view rule the module makes (a function), for logs and reports",
    ("chainweaver.mcp.runs.prometheus", "daemon_threads"):
        "socketserver's documented switch, on the metrics endpoint's own HTTP server",
    ("chainweaver.files", "yaml_implicit_resolvers"):
        "PyYAML's resolver table, on the module's own loader class",
    ("chainweaver.cli.stores", "msg"):
        "a logging.Filter rewrites the LogRecord it is given (logging's documented way)",
    ("chainweaver.cli.stores", "args"): "the same LogRecord's arguments",
    ("chainweaver.cli.stores", "exc_info"): "the same LogRecord's exception",
    ("chainweaver.cli.stores", "exc_text"): "the same LogRecord's exception text",
    ("chainweaver.cli.options", "*"):
        "argparse's Namespace: the defaults of HTTP flags the user left out",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parsed() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(PACKAGE.rglob("*.py"))}


def _assigned(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def _own(value: ast.expr) -> bool:
    return isinstance(value, ast.Name) and value.id in ("self", "cls")


def defined_attributes(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Attribute name -> the classes (``module.Class``) that define it."""
    defined: dict[str, set[str]] = defaultdict(set)
    for module, tree in modules.items():
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            owner = f"{module}.{cls.name}"
            for statement in cls.body:
                for target in _assigned(statement):
                    if isinstance(target, ast.Name):
                        defined[target.id].add(owner)
                if isinstance(statement, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__slots__"
                        for t in statement.targets) and isinstance(
                        statement.value, (ast.Tuple, ast.List)):
                    for item in statement.value.elts:
                        if isinstance(item, ast.Constant) and isinstance(item.value, str):
                            defined[item.value].add(owner)
            for node in ast.walk(cls):
                for target in _assigned(node):
                    for part in ast.walk(target):
                        if isinstance(part, ast.Attribute) and _own(part.value):
                            defined[part.attr].add(owner)
    return defined


def attribute_writes(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, the object written, the attribute) of every write to an attribute of an
    object other than ``self`` or ``cls``."""
    for node in ast.walk(tree):
        for target in _assigned(node):
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store) \
                        and not _own(part.value):
                    yield node.lineno, ast.unparse(part.value), part.attr
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            function = node.func
            setter = (isinstance(function, ast.Name) and function.id == "setattr") or (
                isinstance(function, ast.Attribute) and function.attr == "__setattr__"
                and ast.unparse(function.value) == "object")
            if setter and not _own(node.args[0]):
                name = node.args[1]
                attribute = name.value if isinstance(name, ast.Constant) else "*"
                yield node.lineno, ast.unparse(node.args[0]), str(attribute)


def foreign_writes(modules: dict[str, ast.Module]) -> list[str]:
    """Every write to an attribute of a class another module defines, not allowed by
    the two lists."""
    defined = defined_attributes(modules)
    found = []
    for module, tree in modules.items():
        for line, written, attribute in attribute_writes(tree):
            owners = defined.get(attribute, set()) if attribute != "*" else set()
            if any(owner.rpartition(".")[0] == module for owner in owners):
                continue  # a class of this module has it
            if any(module in RECORD_WRITERS.get(owner, (frozenset(), ""))[0]
                   for owner in owners):
                continue
            if not owners and ((module, attribute) in FOREIGN_ATTRIBUTES
                               or (module, "*") in FOREIGN_ATTRIBUTES):
                continue
            where = ", ".join(sorted(owners)) or "no class of the package"
            found.append(f"{module}:{line}: {written}.{attribute} (defined by {where})")
    return found


def test_no_module_sets_the_attributes_of_another_modules_class() -> None:
    assert foreign_writes(parsed()) == []


def test_the_check_finds_a_dependency_set_after_construction() -> None:
    """What the check exists for: wiring another module's object after it was built."""
    modules = {
        "chainweaver.mcp.gate.security": ast.parse(
            "class SecurityGate:\n    def __init__(self):\n        self.run_target = None\n"),
        "chainweaver.mcp.server": ast.parse(
            "def build(gate, target):\n    gate.run_target = target\n"
            "    setattr(gate, 'run_target', target)\n"),
    }
    assert foreign_writes(modules) == [
        "chainweaver.mcp.server:2: gate.run_target "
        "(defined by chainweaver.mcp.gate.security.SecurityGate)",
        "chainweaver.mcp.server:3: gate.run_target "
        "(defined by chainweaver.mcp.gate.security.SecurityGate)"]


def test_the_allowed_lists_name_what_exists() -> None:
    """No stale entry: every record class and writer module, and every module of a
    foreign attribute, is in the package."""
    modules = parsed()
    classes = {f"{module}.{node.name}" for module, tree in modules.items()
               for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    assert set(RECORD_WRITERS) <= classes
    writers = {module for allowed, _ in RECORD_WRITERS.values() for module in allowed}
    assert writers <= set(modules)
    assert {module for module, _ in FOREIGN_ATTRIBUTES} <= set(modules)
