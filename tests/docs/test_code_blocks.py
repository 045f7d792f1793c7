"""Every ```python block in the README and docs runs on its own.

The docs promise that a reader can copy any one block and run it, so each block is run
the way that reader would run it: alone, as ``__main__``, in a process of its own
started from an empty directory, compiled without any ``__future__`` flag of this test
module (``from __future__ import annotations`` here would otherwise postpone the block's
annotations and hide a missing import). No block may depend on a name, an import or a
file from an earlier block. A block that starts a server gets a ``FlowServer.serve``
that returns at once.

Each block's process is forked from one interpreter per test worker that has imported
the library and its dependencies and done nothing else (no thread, no event loop, no
logging set up): importing them took most of each block's time. The block still starts
from a fresh ``__main__`` namespace, so an import it lacks fails as it would for a
reader, and whatever it changes (a tracer provider, logging, a patched class) ends
with its process.

Executing a block cannot catch a name used only inside a function it never calls, so
every block is also checked statically: each global name it reads, at any depth, is
bound by the block itself or is a builtin. The page-specific tests check what the
blocks print and do.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import subprocess
import symtable
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT = 120

# Run in the child interpreter: read the block from stdin, run it as a fresh __main__.
# The runner's own names live in the runner's namespace, never in the block's.
RUNNER = """\
import sys, types
page, line = sys.argv[1], int(sys.argv[2])
source = sys.stdin.read()
if ".serve(" in source:
    from chainweaver.mcp import FlowServer
    FlowServer.serve = lambda self, *args, **kwargs: None
# Line numbers in tracebacks point into the page; no __future__ flag is inherited.
code = compile("\\n" * (line - 1) + source, page, "exec", dont_inherit=True)
main = types.ModuleType("__main__")
main.__file__ = page
sys.modules["__main__"] = main
exec(code, main.__dict__)
"""


# One per test worker: imports what blocks import, then forks a child per block (a
# request is a JSON line; the answer the child's exit status). The child runs RUNNER's
# steps with its stdout and stderr in files, from the block's directory.
FORK_SERVER = """\
import json, os, signal, sys, time, traceback, types
for name in ("pydantic", "chainweaver", "chainweaver.mcp", "fastmcp", "yaml",
             "opentelemetry.sdk.trace", "opentelemetry.sdk.metrics"):
    try:
        __import__(name)
    except ImportError:
        pass
del name


def run_block(request):
    os.chdir(request["cwd"])
    for fd, path in ((1, request["out"]), (2, request["err"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(os.devnull)
    sys.argv = [request["page"]]
    source = request["code"]
    if ".serve(" in source:
        from chainweaver.mcp import FlowServer
        FlowServer.serve = lambda self, *args, **kwargs: None
    code = compile("\\n" * (request["line"] - 1) + source, request["page"], "exec",
                   dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = request["page"]
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


for line in sys.stdin:
    request = json.loads(line)
    child = os.fork()
    if child == 0:
        status = 0
        try:
            run_block(request)
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else (stop.code is not None)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    deadline = time.monotonic() + request["timeout"]
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            status = -1
            break
        time.sleep(0.01)
    code = os.waitstatus_to_exitcode(status) if status != -1 else -1
    print(json.dumps({"status": code}), flush=True)
"""


class ForkServer:
    """Runs a block in a process forked from an interpreter with its imports done."""

    def __init__(self) -> None:
        env = {key: value for key, value in os.environ.items()
               if key not in ("PYTHONSTARTUP", "PYTHONINSPECT")}
        self.process = subprocess.Popen([sys.executable, "-c", FORK_SERVER],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)

    def run(self, page: str, line: int, code: str, cwd: Path) -> tuple[int, str]:
        """The block's exit status and what it wrote to stderr."""
        assert self.process.stdin is not None and self.process.stdout is not None
        out, err = cwd / ".block-stdout", cwd / ".block-stderr"
        request = {"page": page, "line": line, "code": code, "cwd": str(cwd),
                   "out": str(out), "err": str(err), "timeout": TIMEOUT}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, "the fork server stopped"
        return json.loads(answer)["status"], err.read_text()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=TIMEOUT)


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()


def python_blocks() -> list[tuple[str, int, str]]:
    """(page, line number, code) for every python block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
            line = text.count("\n", 0, match.start()) + 2
            found.append((str(page.relative_to(ROOT)), line, match.group(1)))
    return found


BLOCKS = python_blocks()
IDS = [f"{page}:{line}" for page, line, _ in BLOCKS]


def unbound_globals(code: str) -> set[str]:
    """Global names the code reads, anywhere, that it never binds and are not builtins."""
    module = symtable.symtable(code, "<block>", "exec")
    bound = {s.get_name() for s in module.get_symbols()
             if s.is_assigned() or s.is_imported() or s.is_namespace()}
    bound |= set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__builtins__"}
    read: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table is module or symbol.is_global()):
                read.add(symbol.get_name())
        for child in table.get_children():
            walk(child)

    walk(module)
    return read - bound


def test_there_are_blocks_to_run() -> None:
    assert len(BLOCKS) >= 20


def test_the_checks_catch_what_a_reader_would_hit() -> None:
    """The two ways a block fails alone: a name used in a signature, or in a body."""
    annotation = "class Limiter:\n    def acquire(self, caller: CallerIdentity) -> bool: ...\n"
    run = subprocess.run([sys.executable, "-c", RUNNER, "page.md", "1"], input=annotation,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode != 0 and "NameError" in run.stderr
    assert unbound_globals("def authorize(ctx):\n    return ctx.kind in TOOL_CALLERS\n") == {
        "TOOL_CALLERS"}
    assert unbound_globals("import json\nX = 1\ndef f(a):\n    return json.dumps([a, X])\n"
                           "class C:\n    y = X\n") == set()


@pytest.mark.parametrize(("page", "line", "code"), BLOCKS, ids=IDS)
def test_each_python_block_reads_only_names_it_binds(page: str, line: int, code: str) -> None:
    assert not unbound_globals(code), f"{page}:{line} uses names it does not define"


@pytest.mark.parametrize(("page", "line", "code"), BLOCKS, ids=IDS)
def test_each_python_block_runs_on_its_own(page: str, line: int, code: str,
                                           tmp_path: Path, fork_server: ForkServer) -> None:
    # From an empty directory where `examples/` is the repository's, as in the docs.
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    status, stderr = fork_server.run(str(ROOT / page), line, code, tmp_path)
    assert status == 0, f"{page}:{line} fails when run alone:\n{stderr}"
