"""What ``install`` and ``dev`` share: the ``chainweaver serve`` command line a client
starts (this environment's Python, absolute paths, the serve options given), the
environment it needs, and the MCP configuration files of the clients ``install`` writes.

A client starts a stdio server itself, from a working directory of its own, with an
environment of its own: so the command is this environment's Python executable (never
a ``python`` found on the client's PATH), every file is an absolute path, and when the
tools or the models of the flow files import from the current folder, the entry puts
it on ``PYTHONPATH`` as ``serve`` run from here would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from .errors import EXIT_INVALID, EXIT_MISSING, EXIT_USAGE, CommandError
from .options import server_options

# serve options whose value is a file: made absolute for a client started elsewhere
PATH_OPTIONS = frozenset({"request_state_key_file", "instructions_file", "audit_log"})
# serve options that only streamable HTTP uses (refused with stdio, which a client-started
# server uses), and --transport itself
HTTP_ONLY = frozenset({"transport", "host", "port", "stateless", "allowed_host",
                       "allowed_origin", "auth_token_file", "auth_jwks_uri",
                       "auth_public_key", "auth_issuer", "auth_audience"})


def add_client_options(parser: argparse.ArgumentParser) -> None:
    """``--env`` and ``--env-file``: the environment the client gives the server."""
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable for the server (repeatable); "
                             "written into the client's configuration as plain text")
    parser.add_argument("--env-file", metavar="FILE",
                        help="read KEY=VALUE lines (a .env file) for the server's "
                             "environment; --env values win")


def serve_command(args: argparse.Namespace) -> list[str]:
    """The command line that serves what ``args`` gives (the options ``serve`` takes),
    over stdio, from any directory: ``[python, "-m", "chainweaver", "serve", ...]``."""
    if args.transport != "stdio":
        raise CommandError(EXIT_USAGE, f"{args.command} starts the server over stdio, as "
                           "clients do: leave out --transport (for streamable HTTP, run "
                           "chainweaver serve and give the client its URL)")
    argv = [python_executable(), "-m", "chainweaver", "serve"]
    argv += [str(Path(path).absolute()) for path in args.paths]
    # argparse keeps each option's flag, default and kind on the parser: the serve
    # parser's own list of them is the one place every serve option is named.
    for action in server_options()._actions:
        if not action.option_strings or action.dest in HTTP_ONLY:
            continue  # positional PATHs (above), and what stdio does not take
        value = getattr(args, action.dest, action.default)
        argv += _option(action, action.option_strings[0], value)
    return argv


def _option(action: argparse.Action, flag: str, value: Any) -> list[str]:
    if action.nargs == 0:  # a switch: store_true, or store_false (--no-...)
        return [flag] if value != action.default else []
    if value is None or value == action.default:
        return []
    values = value if isinstance(value, list) else [value]
    shown = []
    for item in values:
        text = str(int(item)) if isinstance(item, float) and item.is_integer() else str(item)
        if action.dest in PATH_OPTIONS or (action.dest == "tools" and _is_file(text)):
            text = str(Path(text).absolute())
        shown += [flag, text]
    return shown


def _is_file(spec: str) -> bool:
    """A --tools value that names a file, not a module (as the loader tells them)."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def python_executable() -> str:
    """This environment's Python, as an absolute path: not resolved through symlinks (a
    virtual environment's python is one, and resolving it would leave the environment)."""
    return os.path.abspath(sys.executable)


def given_environment(args: argparse.Namespace) -> dict[str, str]:
    """``--env-file`` then ``--env`` values (checked before anything is loaded)."""
    env: dict[str, str] = {}
    if args.env_file is not None:
        env.update(read_env_file(args.env_file))
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(EXIT_USAGE, f"--env {item!r}: not KEY=VALUE")
        env[key.strip()] = value
    return env


def server_environment(given: dict[str, str], tools: list[str]) -> dict[str, str]:
    """``given``, plus ``PYTHONPATH`` when the tools or models loaded came from the
    current folder (and no PYTHONPATH was given). Call it once the flows are loaded."""
    if "PYTHONPATH" not in given and imports_from_cwd(tools):
        return {**given, "PYTHONPATH": os.getcwd()}
    return given


def read_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines; blank lines, ``#`` comments and a leading ``export`` are
    skipped; a value in matching quotes loses them."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandError(EXIT_MISSING, f"--env-file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(EXIT_MISSING, f"--env-file {path}: cannot be read: "
                           f"{error}") from None
    env = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip():
            raise CommandError(EXIT_INVALID, f"--env-file {path}, line {number}: not "
                               "KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def imports_from_cwd(tools: list[str]) -> bool:
    """Whether a loaded module (a dotted --tools module, or a model a flow file names)
    can only be found because the current folder is on the import path, which a
    client-started server would not search. Modules next to a --tools file are found
    anyway: serve puts that file's folder on the path."""
    here = Path.cwd().resolve()
    tool_dirs = {Path(spec).absolute().resolve().parent for spec in tools if _is_file(spec)}
    if here in tool_dirs:
        return False
    elsewhere = [entry for entry in sys.path if entry and _resolved(entry) != here]
    for name, module in list(sys.modules.items()):
        location = getattr(module, "__file__", None)
        if "." in name or not location:
            continue  # top-level modules only: a package's modules follow it
        path = Path(location).resolve()
        top = path.parent.parent if path.name == "__init__.py" else path.parent
        if top == here and not _found_without(name, elsewhere):
            return True
    return False


def _found_without(name: str, path: list[str]) -> bool:
    """Whether ``name`` is found by the import system with ``path`` as sys.path (an
    installed package, an editable install's own finder, ...)."""
    for finder in sys.meta_path:
        try:
            if finder is PathFinder:
                found = PathFinder.find_spec(name, path)
            else:
                found = finder.find_spec(name, None)
        except Exception:  # a finder that cannot answer this question
            continue
        if found is not None:
            return True
    return False


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry).resolve()
    except OSError:
        return None


# ------------------------------------------------------------------ configuration files


def entry(command: list[str], env: dict[str, str], *, vscode: bool = False
          ) -> dict[str, Any]:
    """A client's server entry: its command, arguments and environment."""
    found: dict[str, Any] = {"type": "stdio"} if vscode else {}
    found.update({"command": command[0], "args": command[1:]})
    if env:
        found["env"] = env
    return found


def read_config(path: Path, section: str) -> dict[str, Any]:
    """The JSON configuration at ``path`` ({} when missing or empty); one that is not a
    JSON object with a ``section`` object is refused, and left as it is."""
    if not path.exists():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(EXIT_MISSING, f"{path}: cannot be read: {error}") from None
    if not text.strip():
        return {}
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandError(EXIT_INVALID, f"{path}: not plain JSON ({error.msg} at line "
                           f"{error.lineno}; comments?): left unchanged; add the entry "
                           "`chainweaver install json` prints by hand") from None
    if not isinstance(document, dict) or not isinstance(document.get(section, {}), dict):
        raise CommandError(EXIT_INVALID, f"{path}: not a configuration with a {section!r} "
                           "object: left unchanged")
    return document


def put_entry(document: dict[str, Any], section: str, name: str, new: dict[str, Any]
              ) -> str:
    """Put ``new`` as ``document[section][name]``, keeping every other key and server.
    An existing entry of that name keeps its other keys, and the environment variables
    the new one does not set. Returns "added" or "updated"."""
    servers = document.setdefault(section, {})
    old = servers.get(name)
    if isinstance(old, dict):
        merged = {**old, **new}
        old_env: dict[str, Any] = old["env"] if isinstance(old.get("env"), dict) else {}
        if old_env or "env" in new:
            merged["env"] = {**old_env, **new.get("env", {})}
        servers[name] = merged
    else:
        servers[name] = new
    return "updated" if old is not None else "added"


def write_json(path: Path, document: dict[str, Any], *, private: bool) -> None:
    """Replace ``path`` in one step (a reader never sees half a file), keeping its
    permissions; a new file holding environment values is readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else (0o600 if private else None)
    temporary = path.with_name(f".{path.name}.chainweaver-{os.getpid()}")
    try:
        temporary.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        if mode is not None:
            temporary.chmod(mode)
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise CommandError(EXIT_MISSING, f"{path}: cannot be written: "
                           f"{error.strerror or error}") from None
