"""What every command that runs, serves or checks flows loads first: tools modules (an
import failure named by file and line) and flow files, registered on a new executor.
Every problem is a :class:`CommandError` with its exit code."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from ..errors import DuplicateToolError
from ..executor import FlowExecutor
from ..files import find_flow_files, load_flows_by_file
from ..flows import Flow
from ..registry import FlowRegistry
from ..tools import Tool
from .errors import EXIT_INVALID, EXIT_MISSING, CommandError


def _import_tools_module(spec: str) -> ModuleType:
    """Import ``spec``: a path to a .py file, or a dotted module name."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        return _import_file(Path(spec), spec)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as error:
        if error.name and (spec == error.name or spec.startswith(f"{error.name}.")):
            raise CommandError(EXIT_MISSING, f"--tools {spec}: no module named "
                               f"{error.name!r}") from None
        raise _import_failed(spec, error, _module_file(spec)) from None
    except (Exception, SystemExit) as error:  # the module's own code failed
        raise _import_failed(spec, error, _module_file(spec)) from None


def _module_file(spec: str) -> str | None:
    """Where a dotted module lives, found without running it again."""
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        return None
    return found.origin if found is not None else None


def _import_failed(spec: str, error: BaseException, module_file: str | None = None
                   ) -> CommandError:
    """One line naming where the import failed: the line of the tools module that was
    running, and the place the exception came from when that is elsewhere."""
    where = _failure_location(error, module_file)
    message = str(error.msg) if isinstance(error, SyntaxError) else str(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return CommandError(EXIT_MISSING, f"--tools {spec}: importing it failed"
                        f"{f' at {where}' if where else ''}: {text}")


def _failure_location(error: BaseException, module_file: str | None) -> str:
    """``file:line`` of the failure, for a person to open in an editor."""
    frames = [(frame.f_code.co_filename, line) for frame, line in
              traceback.walk_tb(error.__traceback__)]
    if isinstance(error, SyntaxError) and error.filename:
        frames.append((error.filename, error.lineno or 0))  # the file that did not parse
    frames = [(name, line) for name, line in frames if not _is_import_machinery(name)]
    if not frames:
        return ""
    origin = frames[-1]
    here = next((f for f in reversed(frames) if module_file and _same_file(f[0], module_file)),
                None)
    if here is None or here == origin:
        return f"{_shown(origin[0])}:{origin[1]}"
    return f"{_shown(here[0])}:{here[1]} (raised at {_shown(origin[0])}:{origin[1]})"


def _shown(filename: str) -> str:
    """A path relative to the current directory when it is inside it, as typed."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd().resolve()))
    except (OSError, ValueError):
        return filename


def _is_import_machinery(filename: str) -> bool:
    return filename.startswith("<frozen ") or filename == __file__


def _same_file(first: str, second: str) -> bool:
    try:
        return Path(first).resolve() == Path(second).resolve()
    except OSError:
        return first == second


def _import_file(path: Path, spec: str) -> ModuleType:
    """Import a file as the module named after it, with its directory on sys.path so it
    can import its neighbours and flow files can reference its models."""
    if not path.is_file():
        raise CommandError(EXIT_MISSING, f"--tools {spec}: no such file")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        loaded_file = getattr(loaded, "__file__", None)
        if loaded_file and Path(loaded_file).resolve() == path.resolve():
            return loaded
        raise CommandError(EXIT_MISSING, f"--tools {spec}: a different module named "
                           f"{name!r} is already imported; rename the file")
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise CommandError(EXIT_MISSING, f"--tools {spec}: cannot be imported as a module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # pydantic resolves postponed annotations through it
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # SystemExit too: sys.exit() while importing
        del sys.modules[name]
        raise _import_failed(spec, error, str(path)) from None
    return module


def register_tools(executor: FlowExecutor, specs: Sequence[str]) -> None:
    """Register every public module-level Tool of each module."""
    owners: dict[str, str] = {}
    for spec in specs:
        module = _import_tools_module(spec)
        found = [v for k, v in vars(module).items()
                 if isinstance(v, Tool) and not k.startswith("_")]
        if not found:
            raise CommandError(EXIT_MISSING, f"--tools {spec}: the module defines no "
                               "chainweaver Tool objects")
        for found_tool in found:
            if executor.tools.get(found_tool.name) is found_tool:
                continue  # the same object, re-exported by another module
            try:
                executor.register_tool(found_tool)
            except DuplicateToolError:
                raise CommandError(EXIT_INVALID, f"--tools {spec}: a different tool named "
                                   f"{found_tool.name!r} already came from "
                                   f"{owners[found_tool.name]}") from None
            owners[found_tool.name] = spec


def import_from_cwd() -> None:
    """Put the current directory on ``sys.path``, as ``python -m`` does: tools modules
    and the models flow files reference import from where the command runs. Every
    command does this first (:func:`.commands.run_command`), so ``serve``, ``run``,
    ``validate`` and ``migrate`` import the same modules from the same folder."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def load_executor(paths: Sequence[str], tools: Sequence[str]
                  ) -> tuple[FlowExecutor, dict[Path, Flow]]:
    """What every command that runs or serves flows loads: the tools of ``tools``
    modules and the flow files under ``paths`` (checked against those tools), all
    registered on a new executor. Also returns the flows by file."""
    executor = FlowExecutor(FlowRegistry())
    register_tools(executor, tools)
    loaded = load_flows_by_file(find_flow_files(paths), tools=executor.tools)
    for flow in loaded.values():
        executor.registry.register_flow(flow)
    return executor, loaded
