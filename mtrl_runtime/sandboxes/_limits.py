"""Per-process resource limits as a ``prlimit`` prefix (util-linux), for the kinds that run host processes.

``prlimit --data=... --cpu=... -- COMMAND`` sets the limits on itself and
execs COMMAND; every process the command starts inherits them:

- ``memory_mb`` → RLIMIT_DATA: the writable memory of each process (heap
  and private mappings; reserved but unused address space, which Node and
  the JVM take gigabytes of, does not count, so harness CLIs still start).
- ``cpu_s`` → RLIMIT_CPU: CPU seconds of each process (SIGKILL at the limit).
- ``max_file_mb`` → RLIMIT_FSIZE: the largest file a process may write
  (SIGXFSZ past it): a flood written to disk stops there.
- ``open_files`` → RLIMIT_NOFILE; core dumps off.
- ``max_processes`` → RLIMIT_NPROC, only when each sandbox has a uid of its
  own (mtrl running as root): the limit counts a uid's processes, so for a
  rootless run it would count the user's whole session.

Totals over all of a sandbox's processes need a cgroup: docker and podman
set them (``--memory``, ``--pids-limit``); docs/sandboxes.md has the table.
"""

from __future__ import annotations

import shutil

from ._settings import SandboxSettings

MB = 1024 * 1024


def prlimit_prefix(settings: SandboxSettings, *, own_uid: bool) -> list[str]:
    """``["prlimit", "--data=N", ..., "--"]`` for ``settings`` (``own_uid``: the sandbox runs as a uid of its own)."""
    limits = [f"--nofile={settings.open_files}", "--core=0"]
    if settings.memory_mb is not None:
        limits.append(f"--data={settings.memory_mb * MB}")
    if settings.cpu_s is not None:
        limits.append(f"--cpu={settings.cpu_s}")
    if settings.max_file_mb is not None:
        limits.append(f"--fsize={settings.max_file_mb * MB}")
    if settings.max_processes is not None and own_uid:
        limits.append(f"--nproc={settings.max_processes}")
    return [prlimit_path(), *limits, "--"]


def prlimit_path() -> str:
    found = shutil.which("prlimit")
    if found is None:
        raise FileNotFoundError("prlimit not found on PATH (Debian: apt-get install util-linux); sandboxes need it "
                                "for their per-process limits")
    return found


def enforced(settings: SandboxSettings, *, own_uid: bool, detached_escape: bool = False) -> dict[str, str]:
    """What each limit is for the kinds that use ``prlimit``, in words (reported by ``Sandboxes.describe``).

    ``detached_escape``: a process that leaves its process group survives the kill (tempdir: no pid namespace).
    """
    tree = ("its process group (a process that detaches into a session of its own survives)" if detached_escape
            else "its whole process tree (the namespace's init)")
    return {
        "time": f"each command killed at its timeout and at the sandbox's deadline: {tree}",
        "output": f"{settings.output_bytes} bytes kept per stream per command, the rest counted and dropped",
        "memory": (f"{settings.memory_mb} MB writable memory per process (RLIMIT_DATA)"
                   if settings.memory_mb is not None else "not limited"),
        "cpu": f"{settings.cpu_s} CPU seconds per process (RLIMIT_CPU)" if settings.cpu_s is not None else "not limited",
        "processes": (f"{settings.max_processes} processes for the sandbox's own uid (RLIMIT_NPROC)"
                      if settings.max_processes is not None and own_uid
                      else "not limited (rootless: RLIMIT_NPROC would count the whole user session)"),
        "file size": (f"{settings.max_file_mb} MB per file written (RLIMIT_FSIZE)"
                      if settings.max_file_mb is not None else "not limited"),
    }


__all__ = ["MB", "enforced", "prlimit_path", "prlimit_prefix"]
