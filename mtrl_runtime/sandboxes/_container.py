"""``docker`` and ``podman``: a container per rollout, from an image the user names, on their own daemon.

The container (``<runtime> run -d``) is the sandbox for the rollout's
whole life; each command is a ``<runtime> exec`` in it. Same folders and
guarantees as ``bubblewrap``, enforced by the runtime:

- ``--network none``: no network but loopback; with a coordinator, the
  container's main process is the relay (``_inside.py``) on the
  coordinator's port, carrying to the socket in ``/run/mtrl`` (bound
  read-only), and so to the coordinator alone;
- ``--read-only`` root file system; ``/workspace``, ``/home/sandbox`` and
  ``/tmp`` bound from the sandbox's folder;
- ``--cap-drop ALL``, ``no-new-privileges``, a non-root user (the
  sandbox's own uid under a root run; podman rootless: ``--userns keep-id``);
- limits on the whole container: ``--memory`` (= ``--memory-swap``),
  ``--pids-limit``, ``--cpus``, and ``--ulimit`` for CPU seconds, file
  size and open files;
- each command runs under ``timeout -s KILL`` in a process group of its own
  whose leader's pid is written to ``/tmp/.mtrl/<tag>.pid``: killing the
  ``exec`` client does not stop a process inside, so a kill is a
  ``kill -KILL -<pgid>`` run in the container; at the deadline the whole
  container is killed;
- ``close`` removes the container (``rm -f``); labels name the process
  that owns it, so a run killed before ``close`` has its containers removed
  by its reaper, or by the next run's sweep.

No daemon runs on mtrl's CI machine: the tests there check the command
lines (``run_argv``, ``exec_argv``) and skip the live ones, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from typing import Any, Mapping, Sequence

from ._base import INSIDE_RUN, RELAY_NAME, SOCKET_NAME, BaseSandbox, SandboxError
from ._dirs import SandboxDirs, is_alive, process_start, running_as_root
from ._limits import MB
from ._relay import coordinator_address
from ._settings import SandboxSettings

OWNER_LABEL = "mtrl.sandbox.owner"
SANDBOX_LABEL = "mtrl.sandbox"
IDLE = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"
# sh -c EXEC_WRAPPER <tag> <seconds> ARGV...: record the group leader's pid, then run ARGV under timeout (0: none)
EXEC_WRAPPER = ('mkdir -p /tmp/.mtrl && echo $$ > "/tmp/.mtrl/$0.pid" && t=$1 && shift && '
                'exec timeout -s KILL "$t" "$@"')
KILL_SCRIPT = 'p=$(cat "/tmp/.mtrl/$0.pid" 2>/dev/null) && { kill -KILL "-$p" 2>/dev/null || kill -KILL "$p"; }'
CLI_S = 60.0


def container_name(dirs: SandboxDirs) -> str:
    return "mtrl-" + dirs.path.name


def run_argv(runtime: str, name: str, settings: SandboxSettings, dirs: SandboxDirs, *, coordinator_port: int | None,
             owner: str, user: str | None, rootless_podman: bool, workdir: str, home: str) -> list[str]:
    """``<runtime> run -d ...``: the rollout's container (pure: tested as is)."""
    argv = [runtime, "run", "-d", "--name", name, "--label", f"{SANDBOX_LABEL}=1", "--label", f"{OWNER_LABEL}={owner}",
            "--init", "--network", "none", "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--hostname", "sandbox",
            "-v", f"{dirs.workspace}:{workdir}:rw", "-v", f"{dirs.home}:{home}:rw", "-v", f"{dirs.tmp}:/tmp:rw",
            "-v", f"{dirs.run}:{INSIDE_RUN}:ro", "-w", workdir]
    for path in settings.ro_paths:
        argv += ["-v", f"{path}:{path}:ro"]
    if rootless_podman:
        argv += ["--userns", "keep-id"]
    elif user is not None:
        argv += ["--user", user]
    if settings.memory_mb is not None:
        argv += ["--memory", f"{settings.memory_mb}m", "--memory-swap", f"{settings.memory_mb}m"]
    if settings.max_processes is not None:
        argv += ["--pids-limit", str(settings.max_processes)]
    if settings.cpus is not None:
        argv += ["--cpus", f"{settings.cpus:g}"]
    if settings.cpu_s is not None:
        argv += ["--ulimit", f"cpu={settings.cpu_s}:{settings.cpu_s}"]
    if settings.max_file_mb is not None:
        size = settings.max_file_mb * MB
        argv += ["--ulimit", f"fsize={size}:{size}"]
    argv += ["--ulimit", f"nofile={settings.open_files}:{settings.open_files}", "--ulimit", "core=0"]
    assert settings.image is not None  # SandboxSettings refuses a container kind without one
    if coordinator_port is None:
        return [*argv, "--entrypoint", "sh", settings.image, "-c", IDLE]
    return [*argv, "--entrypoint", settings.python, settings.image, f"{INSIDE_RUN}/{RELAY_NAME}",
            str(coordinator_port), f"{INSIDE_RUN}/{SOCKET_NAME}", "sh", "-c", IDLE]


def exec_argv(runtime: str, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, tag: str,
              timeout_s: float | None, *, stdin: bool = True) -> list[str]:
    """``<runtime> exec ...``: one command in the container, in its own process group, killed at ``timeout_s``."""
    out = [runtime, "exec"] + (["-i"] if stdin else []) + ["-w", cwd]
    for key, value in env.items():
        out += ["-e", f"{key}={value}"]
    seconds = "0" if timeout_s is None else f"{max(1, int(timeout_s + 0.999))}"
    return [*out, name, "sh", "-c", EXEC_WRAPPER, tag, seconds, *argv]


class ContainerSandbox(BaseSandbox):
    """A rollout's container (module docstring); ``runtime`` is ``docker`` or ``podman``."""

    kind = "docker"
    runtime = "docker"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.container = container_name(self.dirs)
        self._tags: dict[int, str] = {}
        self._started_container = False

    def _rootless_podman(self) -> bool:
        return self.runtime == "podman" and not running_as_root()

    def _user(self) -> str:
        uid = self.dirs.uid if self.dirs.uid is not None else os.getuid()
        gid = self.dirs.gid if self.dirs.gid is not None else os.getgid()
        return f"{uid}:{gid}"

    async def begin(self) -> None:
        await super().begin()
        port = coordinator_address(self.coordinator)[1] if self.coordinator else None
        owner = f"{os.getpid()}:{process_start(os.getpid())}"
        argv = run_argv(self.runtime, self.container, self.settings, self.dirs, coordinator_port=port, owner=owner,
                        user=self._user(), rootless_podman=self._rootless_podman(), workdir=self.workdir,
                        home=self.home)
        self.dirs.write_owner(self.kind, container=[self.runtime, self.container])
        self._on_event("container", self.dirs.path, container=[self.runtime, self.container])
        done = await asyncio.to_thread(subprocess.run, argv, stdin=subprocess.DEVNULL, capture_output=True,
                                       text=True, timeout=self.settings.start_timeout_s)
        if done.returncode != 0:
            raise SandboxError(f"{self.runtime} run ({self.settings.image}) failed: {done.stderr.strip()}")
        self._started_container = True

    def _inner(self, argv: list[str]) -> list[str]:
        return argv  # the container's main process is the relay

    def wrap(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, timeout_s: float | None) -> list[str]:
        return exec_argv(self.runtime, self.container, argv, env, cwd, secrets.token_hex(6), timeout_s)

    def spawned(self, proc: asyncio.subprocess.Process, host_argv: Sequence[str]) -> None:
        self._tags[proc.pid] = host_argv[host_argv.index(EXEC_WRAPPER) + 1]

    async def kill(self, proc: asyncio.subprocess.Process) -> None:
        tag = self._tags.pop(proc.pid, None)
        if tag is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                await asyncio.to_thread(subprocess.run, [self.runtime, "exec", self.container, "sh", "-c",
                                                         KILL_SCRIPT, tag],
                                        stdin=subprocess.DEVNULL, capture_output=True, timeout=CLI_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def _deadline_passed(self) -> None:
        await super()._deadline_passed()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            await asyncio.to_thread(subprocess.run, [self.runtime, "kill", self.container], stdin=subprocess.DEVNULL,
                                    capture_output=True, timeout=CLI_S)

    async def end(self) -> None:
        await asyncio.to_thread(remove_container, self.runtime, self.container)


class PodmanSandbox(ContainerSandbox):
    kind = "podman"
    runtime = "podman"


def enforced(settings: SandboxSettings) -> dict[str, str]:
    """What each limit is for a container, in words (reported by ``Sandboxes.describe``)."""
    def given(value: object, text: str) -> str:
        return text if value is not None else "not limited"

    return {
        "time": "each command under timeout -s KILL in its own process group; the container killed at the deadline",
        "output": f"{settings.output_bytes} bytes kept per stream per command, the rest counted and dropped",
        "memory": given(settings.memory_mb, f"{settings.memory_mb} MB for the whole container (--memory)"),
        "cpu": given(settings.cpu_s, f"{settings.cpu_s} CPU seconds per process (--ulimit cpu)")
        + (f", {settings.cpus:g} CPUs (--cpus)" if settings.cpus is not None else ""),
        "processes": given(settings.max_processes, f"{settings.max_processes} for the container (--pids-limit)"),
        "file size": given(settings.max_file_mb, f"{settings.max_file_mb} MB per file written (--ulimit fsize)"),
    }


def remove_container(runtime: str, name: str) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([runtime, "rm", "-f", name], stdin=subprocess.DEVNULL, capture_output=True, timeout=CLI_S)


def unavailable_reason(runtime: str) -> str | None:
    """None when ``<runtime> info`` answers; else why not."""
    path = shutil.which(runtime)
    if path is None:
        return f"{runtime}: not on PATH (install {runtime} and start its daemon, or use kind: bubblewrap)"
    try:
        done = subprocess.run([path, "info"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{runtime}: `{runtime} info` did not answer: {exc}"
    if done.returncode != 0:
        return f"{runtime}: no daemon answers (`{runtime} info`: {done.stderr.strip().splitlines()[-1:] or ''})"
    return None


def sweep_containers(runtime: str) -> list[str]:
    """Remove the containers whose owning process has ended (labelled ``mtrl.sandbox.owner=pid:start``)."""
    try:
        listed = subprocess.run([runtime, "ps", "-a", "--filter", f"label={SANDBOX_LABEL}=1", "--format", "{{.Names}}"],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    removed = []
    for name in listed.stdout.split():
        owner = subprocess.run([runtime, "inspect", "--format", f'{{{{index .Config.Labels "{OWNER_LABEL}"}}}}', name],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_S).stdout.strip()
        pid, _, start = owner.partition(":")
        if pid.isdigit() and is_alive(int(pid), int(start) if start.isdigit() else None):
            continue
        remove_container(runtime, name)
        removed.append(name)
    return removed


__all__ = ["ContainerSandbox", "EXEC_WRAPPER", "PodmanSandbox", "container_name", "enforced", "exec_argv",
           "remove_container", "run_argv", "sweep_containers", "unavailable_reason"]
