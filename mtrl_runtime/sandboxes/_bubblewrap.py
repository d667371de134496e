"""``bubblewrap``: a rootless namespace sandbox per rollout (Debian package ``bubblewrap``, ``/usr/bin/bwrap``).

Each command runs in fresh namespaces (``--unshare-all``: user, mount,
pid, network, ipc, uts, cgroup) that see:

- a read-only root holding only the mount points below, and the system
  read-only: ``/usr``, ``/etc`` and the ``/bin``, ``/lib*``,
  ``/sbin`` links (plus ``ro_paths``); nothing else of the host: not the
  repository, not the run folder, not other sandboxes, not ``/home``;
- the rollout's own ``/workspace`` (read-write), ``$HOME`` (``/home/sandbox``)
  and ``/tmp``, which live on the host under the sandbox's folder and so
  persist from one command to the next;
- ``/proc`` of its own pid namespace (it sees only its own processes), a
  minimal ``/dev``, a 64 MiB ``/dev/shm``;
- no network but its own loopback; with a coordinator, ``/run/mtrl`` holds
  the relay to it (``_relay``), listening on the coordinator's port.

It runs as uid 1000 inside, with no capabilities (under root, as a uid of
its own outside too: see ``_dirs``). ``--die-with-parent`` kills it when
the process that started it dies (SIGKILL included); ``--new-session``
keeps it off the caller's terminal. Killing the outer ``bwrap`` (its
process group) ends the namespace's init and with it every process inside,
including ones that left the process group.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import PurePosixPath
from typing import Any, Mapping, Sequence

from ._base import INSIDE_RUN, BaseSandbox, SandboxUnavailable
from ._dirs import SandboxDirs
from ._limits import prlimit_prefix
from ._settings import SandboxSettings

SYSTEM_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
INSIDE_UID = 1000
SHM_BYTES = 64 * 1024 * 1024  # /dev/shm is memory: bounded
CHECK_S = 20.0


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def system_mounts(paths: Sequence[str] = SYSTEM_PATHS) -> list[tuple[str, list[str]]]:
    """Read-only binds of the system paths that exist (a link, as on merged-/usr Debian, stays a link), each
    with its destination."""
    mounts: list[tuple[str, list[str]]] = []
    for path in paths:
        if os.path.islink(path):
            mounts.append((path, ["--symlink", os.readlink(path), path]))
        elif os.path.exists(path):
            mounts.append((path, ["--ro-bind", path, path]))
    return mounts


def system_binds(paths: Sequence[str] = SYSTEM_PATHS) -> list[str]:
    """``system_mounts``' arguments, in their order."""
    return [arg for _, args in system_mounts(paths) for arg in args]


def bwrap_argv(bwrap: str, dirs: SandboxDirs, settings: SandboxSettings, argv: Sequence[str],
               env: Mapping[str, str], cwd: str, *, workdir: str, home: str) -> list[str]:
    """The ``bwrap ...`` command line that runs ``argv`` in one sandbox (pure: tested as is).

    bwrap mounts in the order of its arguments, a later mount hiding what an earlier one put below its
    destination. The mounts go shallowest destination first, as container runtimes order volumes: a
    ``ro_paths`` folder inside the sandbox's own ``/tmp`` (a project under ``/tmp`` holding a harness CLI)
    is bound over it, not hidden by it; at one depth the sandbox's own mounts come last, so ``ro_paths``
    ``/tmp`` itself cannot replace the sandbox's ``/tmp`` with the host's."""
    out = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID),
           "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv"]
    own = [("/proc", ["--proc", "/proc"]), ("/dev", ["--dev", "/dev"]),
           ("/dev/shm", ["--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]),
           (workdir, ["--bind", str(dirs.workspace), workdir]), (home, ["--bind", str(dirs.home), home]),
           ("/tmp", ["--bind", str(dirs.tmp), "/tmp"]), (INSIDE_RUN, ["--ro-bind", str(dirs.run), INSIDE_RUN])]
    shared = [(path, ["--ro-bind", path, path]) for path in settings.ro_paths]  # the provider checked they exist
    mounts = sorted([*system_mounts(), *shared, *own], key=lambda mount: _depth(mount[0]))  # stable
    out += [arg for _, args in mounts for arg in args]
    out += ["--remount-ro", "/", "--chdir", cwd]
    for key, value in env.items():
        out += ["--setenv", key, value]
    return [*out, "--", *argv]


def _depth(path: str) -> int:
    return len(PurePosixPath(path).parts)


class BubblewrapSandbox(BaseSandbox):
    """A rollout's namespace sandbox (module docstring)."""

    kind = "bubblewrap"

    def wrap(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, timeout_s: float | None) -> list[str]:
        bwrap = bwrap_path()
        if bwrap is None:
            raise SandboxUnavailable(unavailable_reason(self.settings) or "bwrap not found")
        limits = prlimit_prefix(self.settings, own_uid=self.dirs.uid is not None)
        return [*limits, *bwrap_argv(bwrap, self.dirs, self.settings, argv, env, cwd, workdir=self.workdir,
                                     home=self.home)]

    def popen_options(self) -> dict[str, Any]:
        if self.dirs.uid is None:
            return {}
        return {"user": self.dirs.uid, "group": self.dirs.gid, "extra_groups": []}

    async def kill(self, proc: asyncio.subprocess.Process) -> None:
        for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass


def unavailable_reason(settings: SandboxSettings, uid: int | None = None) -> str | None:
    """None when bubblewrap can make a sandbox here; else why not, naming the fix."""
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap: bwrap is not on PATH (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
    argv = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID),
            "--die-with-parent", *system_binds(), "--proc", "/proc", "--dev", "/dev", "--", "true"]
    options: dict[str, Any] = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CHECK_S,
                              **options)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap: {bwrap} could not run: {exc}"
    if done.returncode != 0:
        return (f"bubblewrap cannot create namespaces here ({done.stderr.strip() or f'exit {done.returncode}'}); "
                "unprivileged user namespaces must be allowed (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces > 0, or an AppArmor profile for bwrap), or use kind: docker / podman")
    return None


__all__ = ["BubblewrapSandbox", "SYSTEM_PATHS", "bwrap_argv", "bwrap_path", "system_binds", "unavailable_reason"]
