"""Each sandbox's folder on the host, who owns it, and removing it (also what a killed run left behind).

``<root>/<name>-<random>/`` holds ``workspace/`` (the rollout's files),
``home/`` and ``tmp/`` (the sandbox's ``$HOME`` and ``/tmp``), ``run/``
(read-only inside: the coordinator's socket and the relay script) and
``owner.json``: the process that opened it (pid and start time, so a reused
pid is not mistaken for it), the kind, the uid it runs as, and the container
if it has one. ``dead_owner`` tells a leftover from a live sandbox; the
provider removes leftovers when it starts (``sweep``).

When mtrl runs as root, each sandbox runs as a uid of its own
(``SandboxSettings.uid_base`` ...): its folders are chowned to it, so even
the host's own permissions keep sandboxes out of each other's files, and
RLIMIT_NPROC counts that sandbox's processes alone.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OWNER_FILE = "owner.json"
SUBDIRS = ("workspace", "home", "tmp")  # owned by the sandbox's uid
RUN_DIR = "run"  # owned by this process, read-only inside


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / "mtrl-sandboxes"


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (/proc/PID/stat field 22), or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]) if fields[0] != "Z" else None  # a zombie has ended


def is_alive(pid: int, start: int | None) -> bool:
    """Whether the process ``pid`` that started at ``start`` still runs (not a later process with its pid)."""
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def running_as_root() -> bool:
    return os.geteuid() == 0


@dataclass(frozen=True)
class SandboxDirs:
    """The host folders of one sandbox, and the uid/gid it runs as (None: this process's own)."""

    path: Path
    uid: int | None
    gid: int | None

    @property
    def workspace(self) -> Path:
        return self.path / "workspace"

    @property
    def home(self) -> Path:
        return self.path / "home"

    @property
    def tmp(self) -> Path:
        return self.path / "tmp"

    @property
    def run(self) -> Path:
        return self.path / RUN_DIR

    @property
    def owner_file(self) -> Path:
        return self.path / OWNER_FILE

    @classmethod
    def create(cls, root: Path, name: str, kind: str, uid: int | None) -> "SandboxDirs":
        """Make the folders under ``root`` (mode 0711: others may pass through, not list), owned as they must be."""
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "sandbox"
        path = Path(tempfile.mkdtemp(prefix=f"{slug}-", dir=root))
        os.chmod(path, 0o711)
        dirs = cls(path, uid, uid)
        dirs.write_owner(kind)
        for sub in SUBDIRS:
            (path / sub).mkdir(mode=0o700)
            if uid is not None:
                os.chown(path / sub, uid, uid)
        dirs.run.mkdir(mode=0o755)
        return dirs

    def write_owner(self, kind: str, **extra: Any) -> None:
        record = {"pid": os.getpid(), "start": process_start(os.getpid()), "kind": kind, "uid": self.uid,
                  "created": time.time(), **extra}
        tmp = self.path / (OWNER_FILE + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.owner_file)

    def remove(self) -> None:
        remove_tree(self.path)


def read_owner(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((path / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def dead_owner(path: Path, grace_s: float = 60.0) -> dict[str, Any] | None:
    """The owner record of a sandbox folder whose owner has ended (a leftover), else None.

    A folder without a readable record is a leftover only once it is older
    than ``grace_s`` (it may be one being created right now).
    """
    record = read_owner(path)
    if record is None:
        try:
            old = time.time() - path.stat().st_mtime > grace_s
        except OSError:
            return None
        return {"pid": None} if old else None
    pid, start = record.get("pid"), record.get("start")
    if isinstance(pid, int) and is_alive(pid, start if isinstance(start, int) else None):
        return None
    return record


def used_uids(root: Path) -> set[int]:
    """The uids the sandboxes under ``root`` run as (live or not: a leftover's files are still theirs)."""
    found = set()
    if root.is_dir():
        for child in root.iterdir():
            record = read_owner(child)
            if record and isinstance(record.get("uid"), int):
                found.add(record["uid"])
    return found


def pick_uid(root: Path, base: int, count: int) -> int:
    """A uid in ``[base, base + count)`` no sandbox under ``root`` uses, chosen at random."""
    taken = used_uids(root)
    rng = random.SystemRandom()
    for _ in range(64):
        uid = base + rng.randrange(count)
        if uid not in taken:
            return uid
    free = sorted(set(range(base, base + count)) - taken)
    if not free:
        raise RuntimeError(f"sandbox uids: all {count} uids from {base} are in use under {root}; raise uid_count")
    return free[0]


def check_reachable(root: Path) -> None:
    """Under root, every folder above ``root`` must let other uids pass (o+x): each sandbox runs as its own uid."""
    for folder in [root, *root.parents]:
        if folder.exists() and not folder.stat().st_mode & stat.S_IXOTH:
            raise ValueError(
                f"root: {str(root)!r}: sandboxes run as their own uids when mtrl runs as root, and {str(folder)!r} "
                f"(mode {oct(folder.stat().st_mode & 0o777)}) does not let them pass; pick a folder under "
                f"{tempfile.gettempdir()!r} (the default) or make it o+x")


def remove_tree(path: Path, attempts: int = 20) -> None:
    """Remove ``path`` and everything in it, even folders a sandbox made unwritable; retried while it changes."""

    def unlock(func: Any, name: str, _exc: Any) -> None:
        parent = os.path.dirname(name)
        for target in (parent, name):
            try:
                os.chmod(target, 0o700, follow_symlinks=False)
            except (OSError, NotImplementedError):
                pass
        try:
            func(name)
        except FileNotFoundError:
            pass

    for attempt in range(attempts):
        if not os.path.lexists(path):
            return
        try:
            shutil.rmtree(path, onerror=unlock)
        except FileNotFoundError:
            pass
        except OSError:
            if attempt == attempts - 1:
                raise
        if os.path.lexists(path):
            time.sleep(0.05 * (attempt + 1))  # a dying process may still be writing
    if os.path.lexists(path):
        raise OSError(f"could not remove {path}")


__all__ = ["OWNER_FILE", "SandboxDirs", "check_reachable", "dead_owner", "default_root", "is_alive", "pick_uid",
           "process_start", "read_owner", "remove_tree", "running_as_root"]
