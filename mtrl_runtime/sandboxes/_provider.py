"""``Sandboxes``: a run's sandboxes, one per rollout, of the kind its settings name.

The first ``open`` prepares the provider once: it checks the kind can run
here (``SandboxUnavailable`` saying why and what to install otherwise),
removes what runs that died left under its root folder (``sweep``: folders
whose owner process has ended, and their containers), and starts the
reaper, which removes this run's sandboxes if this process dies without
closing them. ``close`` closes every sandbox still open and stops the
reaper.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

from ._base import BaseSandbox, SandboxUnavailable
from ._container import remove_container
from ._dirs import SandboxDirs, check_reachable, dead_owner, default_root, pick_uid, remove_tree, running_as_root
from ._reaper import Reaper
from ._registry import SANDBOXES, SandboxKind
from ._settings import SandboxSettings

log = logging.getLogger(__name__)


def sweep(root: Path) -> list[str]:
    """Remove the sandbox folders under ``root`` whose owner has ended (with their containers); returns them."""
    removed = []
    if not root.is_dir():
        return removed
    for child in sorted(root.iterdir()):
        record = dead_owner(child) if child.is_dir() else None
        if record is None:
            continue
        container = record.get("container")
        if isinstance(container, list) and len(container) == 2:
            remove_container(str(container[0]), str(container[1]))
        try:
            remove_tree(child)
            removed.append(str(child))
        except OSError as exc:
            log.warning("sandbox sweep: could not remove %s: %s", child, exc)
    return removed


class Sandboxes:
    """Opens one sandbox per rollout (module docstring); safe to share between the rollouts of a run."""

    def __init__(self, settings: SandboxSettings | Mapping[str, Any] | None = None) -> None:
        self.settings = SandboxSettings.coerce(settings)
        self.kind: SandboxKind = SANDBOXES.get(self.settings.kind)
        self.root = Path(self.settings.root) if self.settings.root else default_root()
        self.own_uid = self.kind.own_uid and running_as_root()
        self.swept: list[str] = []  # what the preparation removed
        self._open: set[BaseSandbox] = set()
        self._reaper = Reaper()
        self._prepared = False
        self._closed = False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Check the kind can run, sweep leftovers, start the reaper (blocking; once; ``open`` calls it)."""
        with self._lock:
            if self._prepared:
                return
            missing = [path for path in self.settings.ro_paths if not Path(path).exists()]
            if missing:
                raise ValueError(f"advanced.sandbox.ro_paths: {missing[0]!r} does not exist on this machine")
            if self.own_uid:
                check_reachable(self.root)
            probe_uid = self.settings.uid_base if self.own_uid else None
            reason = self.kind.unavailable(self.settings, probe_uid)
            if reason is not None:
                raise SandboxUnavailable(f"advanced.sandbox.kind {self.settings.kind!r}: {reason}")
            self.swept = sweep(self.root) + self.kind.sweep()
            if self.swept:
                log.info("sandboxes: removed %d left by runs that ended without closing them", len(self.swept))
            self._reaper.start()
            self._prepared = True

    def unavailable(self) -> str | None:
        """Why this kind cannot run here (None: it can), without preparing anything."""
        probe_uid = self.settings.uid_base if self.own_uid else None
        return self.kind.unavailable(self.settings, probe_uid)

    async def open(self, name: str, *, coordinator: str | None = None,
                   timeout_s: float | None = None) -> BaseSandbox:
        """A new sandbox named after ``name`` (a rollout id); ``coordinator``: the one URL it may reach.

        ``timeout_s``: its deadline from now; everything in it is killed then.
        """
        if self._closed:
            raise RuntimeError("Sandboxes: closed")
        if not self._prepared:
            await asyncio.to_thread(self.prepare)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        dirs = await asyncio.to_thread(self._make_dirs, name)
        self._reaper.send("add", dirs.path)
        sandbox = self.kind.sandbox(self.settings, dirs, name, coordinator=coordinator,
                                    deadline=deadline,
                                    on_event=self._event)
        try:
            await sandbox.begin()
        except BaseException:
            await sandbox.close()
            raise
        self._open.add(sandbox)
        return sandbox

    def _make_dirs(self, name: str) -> SandboxDirs:
        uid = pick_uid(self.root, self.settings.uid_base, self.settings.uid_count) if self.own_uid else None
        return SandboxDirs.create(self.root, name, self.kind.name, uid)

    def _event(self, op: str, path: Path, **fields: Any) -> None:
        if op == "done":
            self._open = {s for s in self._open if s.dirs.path != path}
        self._reaper.send(op, path, **fields)

    @asynccontextmanager
    async def sandbox(self, name: str, *, coordinator: str | None = None,
                      timeout_s: float | None = None) -> AsyncIterator[BaseSandbox]:
        """``open`` as an async context manager: closed (everything killed, the folder removed) on exit."""
        box = await self.open(name, coordinator=coordinator, timeout_s=timeout_s)
        try:
            yield box
        finally:
            await box.close()

    @property
    def open_count(self) -> int:
        return len(self._open)

    def describe(self) -> dict[str, Any]:
        """The kind, the root folder and what each limit is here, in words (docs/sandboxes.md has the table)."""
        return {"kind": self.settings.kind, "root": str(self.root),
                "enforced": self.kind.enforced(self.settings, self.own_uid)}

    async def close(self) -> None:
        """Close every sandbox still open, then stop the reaper."""
        self._closed = True
        for sandbox in list(self._open):
            await sandbox.close()
        await asyncio.to_thread(self._reaper.stop)


__all__ = ["Sandboxes", "sweep"]
