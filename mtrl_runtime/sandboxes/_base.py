"""What every kind of sandbox shares: its time, its processes, its files, and its end.

A kind says how to wrap a command (``wrap``) and how to kill what it
started (``kill``); this class runs commands through ``_process`` with the
settings' output cap, clamps every time limit to the sandbox's deadline,
kills long-lived processes when the deadline passes, reads and writes files
by running ``cat`` inside (so a link planted by the sandboxed code resolves
inside the sandbox, never on the host), and on ``close`` kills everything,
stops the relay and removes the folder, once, however the rollout ended.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..types import CommandResult
from ._dirs import SandboxDirs, process_start
from ._process import StartedProcess, collect, collect_raw, spawn
from ._relay import CoordinatorRelay, coordinator_address, inside_url
from ._settings import SandboxSettings

SOCKET_NAME = "coord.sock"
RELAY_NAME = "relay.py"
INSIDE_RUN = "/run/mtrl"  # where the run folder appears inside (namespace and container kinds)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(RuntimeError):
    """A sandbox could not do what was asked (a file it cannot read, a closed sandbox)."""


class SandboxUnavailable(RuntimeError):
    """This kind of sandbox cannot run on this machine; the message says why and what to do."""


class BaseSandbox(abc.ABC):
    """One rollout's sandbox (satisfies ``types.Sandbox``); subclasses say how commands are wrapped and killed."""

    kind = "base"
    workdir = "/workspace"
    home = "/home/sandbox"
    uses_relay = True  # no network inside: the coordinator is reached through the relay (False: the host's network)

    def __init__(self, settings: SandboxSettings, dirs: SandboxDirs, name: str, *, coordinator: str | None,
                 deadline: float | None, on_event: Callable[..., None] | None = None) -> None:
        self.settings = settings
        self.dirs = dirs
        self.name = name
        self.deadline = deadline  # time.monotonic() at which everything inside is killed
        self.coordinator = coordinator
        self.coordinator_url = (inside_url(coordinator) if self.uses_relay else coordinator) if coordinator else None
        self._on_event = on_event or (lambda *a, **k: None)
        self._relay: CoordinatorRelay | None = None
        self._started: list[StartedProcess] = []
        self._running: set[asyncio.subprocess.Process] = set()  # run()/read_file commands not ended yet: close kills them
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.commands = 0  # how many commands ran (file operations included)

    @property
    def host_workspace(self) -> Path:
        return self.dirs.workspace

    # -- what a kind provides ----------------------------------------------------------------------

    @abc.abstractmethod
    def wrap(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, timeout_s: float | None) -> list[str]:
        """The host argv that runs ``argv`` inside (``timeout_s``: for kinds that must bound it inside)."""

    def popen_options(self) -> dict[str, Any]:
        """Extra ``Popen`` keywords (the uid to run as)."""
        return {}

    def spawned(self, proc: asyncio.subprocess.Process, host_argv: Sequence[str]) -> None:
        """Called once a wrapped command has started (a kind that must remember something to kill it)."""

    @abc.abstractmethod
    async def kill(self, proc: asyncio.subprocess.Process) -> None:
        """Kill everything ``proc`` started (its process group, the namespace with it)."""

    async def begin(self) -> None:
        """Start what the sandbox needs before its first command (the relay, a container)."""
        if self.coordinator and self.uses_relay:
            host, port = coordinator_address(self.coordinator)
            shutil.copyfile(Path(__file__).with_name("_inside.py"), self.dirs.run / RELAY_NAME)
            self._relay = CoordinatorRelay(self.dirs.run / SOCKET_NAME, host, port)
            self._relay.start()
        if self.deadline is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + max(0.0, self.deadline - time.monotonic()),
                                       lambda: asyncio.ensure_future(self._deadline_passed()))

    async def end(self) -> None:
        """Stop what ``begin`` started (a container); the folder is removed after."""

    # -- commands -----------------------------------------------------------------------------------

    def base_env(self) -> dict[str, str]:
        env = {"PATH": PATH, "HOME": self.home, "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb",
               "PYTHONUNBUFFERED": "1"}
        if self.coordinator_url:
            env["MTRL_COORDINATOR_URL"] = self.coordinator_url
        return env

    def _argv(self, command: str | Sequence[str]) -> list[str]:
        if isinstance(command, str):
            return ["sh", "-c", command]
        argv = [str(a) for a in command]
        if not argv:
            raise ValueError("command: an empty argv")
        return argv

    def _inner(self, argv: list[str]) -> list[str]:
        """``argv`` behind the relay when the sandbox may reach the coordinator."""
        if not self.coordinator or not self.uses_relay:
            return argv
        _, port = coordinator_address(self.coordinator)
        return [self.settings.python, f"{INSIDE_RUN}/{RELAY_NAME}", str(port), f"{INSIDE_RUN}/{SOCKET_NAME}", *argv]

    def _limit(self, timeout_s: float | None) -> float:
        limit = self.settings.timeout_s if timeout_s is None else timeout_s
        if self.deadline is not None:
            limit = min(limit, self.deadline - time.monotonic())
        return limit

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.name!r} is closed")

    async def _spawn(self, command: str | Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
                     timeout_s: float | None, stdin: bool) -> tuple[list[str], asyncio.subprocess.Process]:
        self._check_open()
        argv = self._argv(command)
        full_env = {**self.base_env(), **self.settings.env, **(env or {})}
        host_argv = self.wrap(self._inner(argv), full_env, cwd or self.workdir, timeout_s)
        proc = await spawn(host_argv, stdin=stdin, **self.popen_options())
        self.spawned(proc, host_argv)
        self.commands += 1
        self._on_event("pid", self.dirs.path, pid=proc.pid, start=process_start(proc.pid))
        return argv, proc

    async def run(self, command: str | Sequence[str], *, timeout_s: float | None = None,
                  stdin: bytes | str | None = None, env: Mapping[str, str] | None = None,
                  cwd: str | None = None) -> CommandResult:
        """Run one command to its end, or kill it at ``timeout_s`` (default ``settings.timeout_s``) or the deadline."""
        limit = self._limit(timeout_s)
        if limit <= 0:
            return CommandResult(tuple(self._argv(command)), None, "", "the sandbox's deadline has passed",
                                 timed_out=True)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        started = time.monotonic()
        argv, proc = await self._spawn(command, env, cwd, limit, stdin=data is not None)
        self._running.add(proc)
        try:
            return await collect(proc, argv, cap=self.settings.output_bytes, timeout_s=limit, kill=self.kill,
                                 stdin=data, started=started)
        finally:
            self._running.discard(proc)

    async def start(self, command: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str | None = None) -> StartedProcess:
        """Start a long-lived process (stdin, stdout, stderr piped); it is killed at the deadline or ``close``."""
        left = None if self.deadline is None else self.deadline - time.monotonic()
        if left is not None and left <= 0:
            raise SandboxError(f"sandbox {self.name!r}: its deadline has passed")
        argv, proc = await self._spawn(command, env, cwd, left, stdin=True)
        started = StartedProcess(proc, argv, self.settings.output_bytes, self.kill, self.deadline)
        self._started.append(started)
        return started

    # -- files (through the sandbox, so paths resolve as code inside sees them) --------------------------

    async def read_file(self, path: str) -> bytes:
        """A file's bytes; FileNotFoundError, or SandboxError when it cannot be read or exceeds ``read_bytes``."""
        _, proc = await self._spawn(["cat", "--", path], None, None, self._limit(None), stdin=False)
        self._running.add(proc)
        try:
            ended = await collect_raw(proc, cap=self.settings.read_bytes, timeout_s=self._limit(None), kill=self.kill)
        finally:
            self._running.discard(proc)
        if ended.exit_code != 0:
            reason = ended.err.kept.decode("utf-8", "replace").strip() or f"exit {ended.exit_code}"
            if "No such file" in reason:
                raise FileNotFoundError(f"{path}: no such file in sandbox {self.name!r}")
            raise SandboxError(f"read_file {path!r}: {reason}")
        if ended.out.dropped:
            raise SandboxError(f"read_file {path!r}: larger than read_bytes ({self.settings.read_bytes} bytes)")
        return bytes(ended.out.kept)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file (its folders made as needed); SandboxError naming the reason when it cannot."""
        result = await self.run(["sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh", path],
                                stdin=data if isinstance(data, bytes) else data.encode())
        if not result.ok:
            raise SandboxError(f"write_file {path!r}: {result.stderr.strip() or result.describe()}")

    async def list_files(self, path: str = ".") -> list[str]:
        """The files under ``path`` (relative to it, sorted; links listed, not followed)."""
        script = 'cd -- "$1" && find . \\( -type f -o -type l \\) -print'
        result = await self.run(["sh", "-c", script, "sh", path])
        if not result.ok:
            raise SandboxError(f"list_files {path!r}: {result.stderr.strip() or result.describe()}")
        return sorted(line[2:] for line in result.stdout.splitlines() if line.startswith("./"))

    # -- the end ----------------------------------------------------------------------------------------

    async def _deadline_passed(self) -> None:
        for started in list(self._started):
            await started.kill()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Kill every process (started ones and commands still running: their ``run`` returns, killed), stop the
        relay, end the container, remove the folder; once."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        try:
            for started in self._started:
                with contextlib.suppress(Exception):
                    await started.kill()
            for proc in list(self._running):  # still in flight: killed now, not left to their timeout
                with contextlib.suppress(Exception):
                    await self.kill(proc)
            with contextlib.suppress(Exception):
                await self.end()
        finally:
            if self._relay is not None:
                self._relay.close()
            await asyncio.to_thread(self.dirs.remove)
            self._on_event("done", self.dirs.path)

    async def __aenter__(self) -> "BaseSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


__all__ = ["BaseSandbox", "INSIDE_RUN", "PATH", "RELAY_NAME", "SOCKET_NAME", "SandboxError", "SandboxUnavailable"]
