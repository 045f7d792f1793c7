"""Following flow files while serving: poll, reload, keep the last good flows on errors.

A :class:`FlowFileWatcher` polls the modification time and size of every flow file
under its paths every ``interval`` seconds. When something changed it loads all the
files again; if they all load, it applies the difference to the registry (a flow
whose file changed is unregistered and registered again, a removed one
unregistered, a new one registered), and a serving ``FlowServer`` follows. If any
file is bad, nothing is applied: the last good flows keep serving, the error is
logged with its file (and line or field), and :attr:`stale` names the files whose
edits are not live.

An edit that loads is checked before anything is unregistered: against the
registry (a name and version registered elsewhere) and against every check added
with :meth:`FlowFileWatcher.add_check` (a ``FlowServer`` adds the checks its next
snapshot would apply, e.g. a prompt name another flow publishes). An edit refused
there leaves the last good version of its flow registered and serving, and its file
stale with the reason, until an edit that is accepted; other files' edits go live.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from .errors import ChainWeaverError, DuplicateFlowError, FlowNotFoundError
from .files import PathLike, find_flow_files, load_flows_by_file
from .flows import Flow
from .registry import FlowRegistry, RegistryState
from .tools import Tool

logger = logging.getLogger("chainweaver.watch")

Stamp = tuple[int, int]  # modification time (ns), size
# Raises (a ChainWeaverError) when the registry in that state could not be published.
StateCheck = Callable[[RegistryState], None]


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
        self._checks: dict[object, StateCheck] = {}
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

    def add_check(self, check: StateCheck) -> Callable[[], None]:
        """Vet every edit before it is applied: ``check(state)`` gets the registry as
        it would be with the edit and raises a :class:`ChainWeaverError` to refuse it
        (the file then stays stale and its last good flow keeps serving). Returns a
        callable that removes the check."""
        token = object()
        self._checks[token] = check

        def remove() -> None:
            self._checks.pop(token, None)

        return remove

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
        except Exception as error:  # a loader bug: still stale and reported, never lost
            logger.exception("loading flow files failed unexpectedly")
            return self._failed(changed, f"cannot be loaded: {type(error).__name__}: "
                                f"{str(error)[:200]}", None)
        self._stale = {}
        before, self._good = self._good, dict(stamps)
        return self._apply(loaded, changed, before)

    def _failed(self, changed: set[Path], error: str, where: object) -> bool:
        self._stale = {path: error for path in changed}
        if where is not None:
            self._stale[Path(str(where))] = error
        logger.error("flow files not reloaded; the last good flows keep serving "
                     "(stale: %s): %s", ", ".join(self.stale) or "none", error)
        return False

    def _apply(self, loaded: dict[Path, Flow], changed: set[Path],
               before: dict[Path, Stamp]) -> bool:
        """Apply the edits of ``changed``: all together when the result is accepted,
        else file by file, each vetted first; a refused file keeps its last good flow."""
        paths = sorted(changed)
        try:
            self._vet(paths, loaded)
            batches = [paths]
            vetted = True
        except ChainWeaverError:  # some edit is refused: find which, one file at a time
            batches = [[path] for path in paths]
            vetted = False
        applied = False
        for batch in batches:
            if not vetted:
                try:
                    self._vet(batch, loaded)
                except ChainWeaverError as error:
                    self._refuse(batch[0], loaded, error, before)
                    continue
            applied = self._swap(batch, loaded, before) or applied
        if applied:
            logger.info("flow files reloaded: %s", ", ".join(str(p) for p in sorted(changed)))
        return applied

    def _vet(self, paths: list[Path], loaded: dict[Path, Flow]) -> None:
        """Raise when the registry with the edits of ``paths`` would be refused."""
        state = self.registry.state()
        flows = dict(state.flows)
        for path in paths:
            old = self._registered.get(path)
            if old is not None and old.name in flows:
                key = old.version_key
                flows[old.name] = tuple(f for f in flows[old.name] if f.version_key != key)
        for path in paths:
            new = loaded.get(path)
            if new is None:
                continue
            versions = flows.get(new.name, ())
            if any(f.version_key == new.version_key for f in versions):
                raise DuplicateFlowError(
                    f"flow {new.name!r} version {new.version!r} is already registered")
            flows[new.name] = tuple(sorted((*versions, new), key=lambda f: f.version_key))
        trial = RegistryState(state.sequence + 1, MappingProxyType(
            {name: versions for name, versions in flows.items() if versions}))
        for check in list(self._checks.values()):
            check(trial)

    def _refuse(self, path: Path, loaded: dict[Path, Flow], error: Exception,
                before: dict[Path, Stamp]) -> None:
        """``path``'s edit is not applied: its last good flow stays, the file is stale,
        and it is tried again with the next reload."""
        self._stale[path] = str(error)
        if path in before:
            self._good[path] = before[path]
        else:
            self._good.pop(path, None)
        name = loaded[path].name if path in loaded else None
        logger.error("%s: edit of flow %r not applied; the last good version keeps "
                     "serving: %s", path, name, error)

    def _swap(self, paths: list[Path], loaded: dict[Path, Flow],
              before: dict[Path, Stamp]) -> bool:
        applied = False
        removed: dict[Path, Flow] = {}
        # Flows whose file changed or went away leave first, then the new ones arrive.
        for path in paths:
            flow = self._registered.pop(path, None)
            if flow is None:
                continue
            try:
                self.registry.unregister(flow.name, flow.version)
                removed[path] = flow
                applied = True
            except FlowNotFoundError:
                pass  # someone else removed it already
        for path in paths:
            if path not in loaded:
                continue
            flow = loaded[path]
            try:
                self.registry.register_flow(flow)
            except ChainWeaverError as error:  # refused after all (a listener, a race)
                self._refuse(path, loaded, error, before)
                self._restore(path, removed.get(path))
                continue
            self._registered[path] = flow
            applied = True
        return applied

    def _restore(self, path: Path, flow: Flow | None) -> None:
        """Register ``path``'s last good flow again after its edit was refused."""
        if flow is None:
            return
        try:
            self.registry.register_flow(flow)
        except ChainWeaverError as error:
            logger.error("%s: the last good version of flow %r could not be registered "
                         "again: %s", path, flow.name, error)
            return
        self._registered[path] = flow

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
