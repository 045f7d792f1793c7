"""Following flow files while serving: poll, reload, keep the last good flows on errors.

A :class:`FlowFileWatcher` polls the modification time and size of every flow file
under its paths every ``interval`` seconds. When something changed it loads all the
files again; if they all load, it applies the difference to the registry (a flow
whose file changed is unregistered and registered again, a removed one
unregistered, a new one registered), and a serving ``FlowServer`` follows. If any
file is bad, nothing is applied: the last good flows keep serving, the error is
logged with its file (and line or field), and :attr:`stale` names the files whose
edits are not live.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import ChainWeaverError, FlowNotFoundError
from .files import PathLike, find_flow_files, load_flows_by_file
from .flows import Flow
from .registry import FlowRegistry
from .tools import Tool

logger = logging.getLogger("chainweaver.watch")

Stamp = tuple[int, int]  # modification time (ns), size


def _stamps(files: Iterable[Path]) -> dict[Path, Stamp]:
    stamps = {}
    for path in files:
        try:
            info = path.stat()
        except OSError:
            continue  # removed between finding and reading: the next poll sees it
        stamps[path] = (info.st_mtime_ns, info.st_size)
    return stamps


class FlowFileWatcher:
    """Keeps a registry in step with flow files (see the module docstring)."""

    def __init__(self, registry: FlowRegistry, paths: PathLike | Iterable[PathLike], *,
                 tools: Mapping[str, Tool] | None = None, interval: float = 1.0,
                 loaded: Mapping[Path, Flow] | None = None) -> None:
        """``loaded``: flows already registered from these files (e.g. at start-up);
        without it the first :meth:`check` registers every flow found."""
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) \
                or not interval > 0:
            raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
        self.registry = registry
        self.paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        self.tools = tools
        self.interval = float(interval)
        self._registered: dict[Path, Flow] = dict(loaded or {})
        # The files as they were when last applied (or adopted).
        self._good: dict[Path, Stamp] = _stamps(self._registered)
        self._seen: dict[Path, Stamp] = dict(self._good)
        self._stale: dict[Path, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stale(self) -> dict[str, str]:
        """File -> the error that keeps its current content from being served."""
        return {str(path): error for path, error in sorted(self._stale.items())}

    def stale_flows(self) -> dict[str, str]:
        """Flow name -> why its file's latest edit is not served (last good one is)."""
        return {flow.name: self._stale[path] for path, flow in self._registered.items()
                if path in self._stale}

    # ------------------------------------------------------------------ polling

    def check(self) -> bool:
        """Poll once; reload and apply when a file changed. True: the registry changed."""
        try:
            stamps = _stamps(find_flow_files(self.paths))
        except FileNotFoundError as error:  # a watched path is gone, or holds no flows
            return self._failed({Path(p) for p in self.paths}, str(error), None)
        if stamps == self._seen:
            return False
        self._seen = stamps
        changed = {path for path in stamps.keys() | self._good.keys()
                   if stamps.get(path) != self._good.get(path)}
        try:
            loaded = load_flows_by_file(stamps, tools=self.tools)
        except (ChainWeaverError, OSError) as error:
            where = getattr(error, "filename", None) or getattr(error, "path", None)
            return self._failed(changed, str(error), where)
        self._stale = {}
        self._good = stamps
        return self._apply(loaded, changed)

    def _failed(self, changed: set[Path], error: str, where: object) -> bool:
        self._stale = {path: error for path in changed}
        if where is not None:
            self._stale[Path(str(where))] = error
        logger.error("flow files not reloaded; the last good flows keep serving "
                     "(stale: %s): %s", ", ".join(self.stale) or "none", error)
        return False

    def _apply(self, loaded: dict[Path, Flow], changed: set[Path]) -> bool:
        applied = False
        # Flows whose file changed or went away leave first, then the new ones arrive.
        for path in sorted(p for p in self._registered if p in changed):
            flow = self._registered.pop(path)
            try:
                self.registry.unregister(flow.name, flow.version)
                applied = True
            except FlowNotFoundError:
                pass  # someone else removed it already
        for path in sorted(p for p in loaded if p in changed):
            flow = loaded[path]
            try:
                self.registry.register_flow(flow)
            except ChainWeaverError as error:  # e.g. a name the server cannot publish
                self._stale[path] = str(error)
                logger.error("%s: flow %r not registered: %s", path, flow.name, error)
                continue
            self._registered[path] = flow
            applied = True
        if applied:
            logger.info("flow files reloaded: %s", ", ".join(str(p) for p in sorted(changed)))
        return applied

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        """Poll every ``interval`` seconds in a daemon thread until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chainweaver-watch",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.interval))
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # never let one bad poll end the watching
                logger.exception("watching flow files failed; trying again")
