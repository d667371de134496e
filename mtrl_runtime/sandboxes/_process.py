"""Running one process for a sandbox: output read up to a cap, a time limit, the whole tree killed.

Every kind builds the argv (``bubblewrap ...``, ``docker exec ...``) and a
``kill`` for it; this module starts it in a session of its own, feeds its
stdin, reads stdout and stderr concurrently (keeping ``cap`` bytes of each
and counting the rest), and kills it when its time is up. After a kill the
pipes are drained for at most ``DRAIN_S``: a process that escaped the kill
still holding a pipe cannot hold the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from ..types import CommandResult

DRAIN_S = 2.0  # after a kill, how long the output pipes may still take to close
Kill = Callable[["asyncio.subprocess.Process"], Awaitable[None]]


@dataclass
class Captured:
    """One stream read up to its cap: the bytes kept, and how many were dropped."""

    kept: bytearray = field(default_factory=bytearray)
    dropped: int = 0


async def _drain(stream: asyncio.StreamReader | None, cap: int, into: Captured) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(64 * 1024)
        if not chunk:
            return
        room = cap - len(into.kept)
        if room > 0:
            into.kept += chunk[:room]
        into.dropped += max(0, len(chunk) - max(room, 0))


async def spawn(argv: Sequence[str], *, stdin: bool, **popen: Any) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session (so its process group can be killed), stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True, **popen,
    )


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.close()


@dataclass
class Ended:
    """How a process ended: its outputs as read, its exit code (None: killed at its time), how long it took."""

    out: Captured
    err: Captured
    exit_code: int | None
    timed_out: bool
    duration_s: float

    def result(self, argv: Sequence[str]) -> CommandResult:
        return CommandResult(
            argv=tuple(argv), exit_code=self.exit_code,
            stdout=self.out.kept.decode("utf-8", "replace"), stderr=self.err.kept.decode("utf-8", "replace"),
            timed_out=self.timed_out, stdout_dropped=self.out.dropped, stderr_dropped=self.err.dropped,
            duration_s=self.duration_s,
        )


async def collect_raw(proc: asyncio.subprocess.Process, *, cap: int, timeout_s: float | None, kill: Kill,
                      stdin: bytes | None = None, started: float | None = None) -> Ended:
    """Read ``proc``'s output up to ``cap`` per stream until it exits or ``timeout_s`` passes (then kill it)."""
    started = time.monotonic() if started is None else started
    out, err = Captured(), Captured()
    readers = [asyncio.ensure_future(_drain(proc.stdout, cap, out)),
               asyncio.ensure_future(_drain(proc.stderr, cap, err))]
    feeder = asyncio.ensure_future(_feed(proc, stdin)) if stdin is not None and proc.stdin is not None else None
    waiter = asyncio.ensure_future(proc.wait())
    timed_out = False
    try:
        if timeout_s is not None and timeout_s <= 0:
            raise asyncio.TimeoutError
        await asyncio.wait_for(asyncio.shield(asyncio.gather(waiter, *readers)), timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
        await kill(proc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), DRAIN_S)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.gather(*readers)), DRAIN_S)
    except BaseException:  # cancelled: the command must not outlive its caller
        await kill(proc)
        raise
    finally:
        for task in (*readers, *([feeder] if feeder else [])):
            if not task.done():
                task.cancel()
    return Ended(out, err, None if timed_out else proc.returncode, timed_out, time.monotonic() - started)


async def collect(proc: asyncio.subprocess.Process, argv: Sequence[str], *, cap: int, timeout_s: float | None,
                  kill: Kill, stdin: bytes | None = None, started: float | None = None) -> CommandResult:
    """``collect_raw`` as a ``CommandResult`` (outputs decoded as UTF-8, bad bytes replaced)."""
    ended = await collect_raw(proc, cap=cap, timeout_s=timeout_s, kill=kill, stdin=stdin, started=started)
    return ended.result(argv)


class StartedProcess:
    """A long-lived process in a sandbox (satisfies ``types.SandboxProcess``)."""

    def __init__(self, proc: asyncio.subprocess.Process, argv: Sequence[str], cap: int, kill: Kill,
                 deadline: float | None) -> None:
        self._proc = proc
        self.argv = tuple(argv)
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self._cap = cap
        self._kill = kill
        self._deadline = deadline
        self._started = time.monotonic()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def _limit(self, timeout_s: float | None) -> float | None:
        if self._deadline is None:
            return timeout_s
        left = max(0.0, self._deadline - time.monotonic())
        return left if timeout_s is None else min(timeout_s, left)

    async def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit code, or None if it still runs after ``timeout_s`` (it is killed at the sandbox's deadline)."""
        limit = self._limit(timeout_s)
        try:
            return await asyncio.wait_for(asyncio.shield(self._proc.wait()),
                                          None if limit is None else limit + (DRAIN_S if limit != timeout_s else 0))
        except asyncio.TimeoutError:
            return None

    async def output(self, timeout_s: float | None = None) -> CommandResult:
        """Both outputs up to the cap until it exits, or killed at ``timeout_s`` (or the sandbox's deadline)."""
        return await collect(self._proc, self.argv, cap=self._cap, timeout_s=self._limit(timeout_s),
                             kill=self._kill, started=self._started)

    async def kill(self) -> None:
        """Kill its whole process tree and reap it."""
        if self._proc.returncode is None:
            await self._kill(self._proc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._proc.wait(), DRAIN_S)


__all__ = ["Captured", "DRAIN_S", "Ended", "Kill", "StartedProcess", "collect", "collect_raw", "spawn"]
