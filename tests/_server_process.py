"""Servers the tests start as subprocesses, reached at the address they print, never at a port picked beforehand.

A port the test picks (bind to port 0, read it, close the socket) and hands to a server can be taken by
another xdist worker's server before this one binds it; that server's health route then answers instead
(it happened to ``mtrl serve`` in test_export). So each server here listens on port 0 and prints where it
listens, and the test reads the address from that line.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

MTRL_SERVING = re.compile(r"^mtrl: serving .* on (?P<url>http://\S+?)/v1$")  # `mtrl serve`'s serving line


@dataclass
class ServerProcess:
    """A server subprocess, its output (stderr merged into stdout) kept line by line as it comes."""

    proc: subprocess.Popen
    _lines: list[str] = field(default_factory=list)
    _closed: bool = False
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:  # read on a thread: a pipe nobody reads fills up and stalls the server
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                with self._changed:
                    self._lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        finally:
            with self._changed:
                self._closed = True
                self._changed.notify_all()

    def output(self) -> str:
        with self._changed:
            return "\n".join(self._lines)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first line of the output matching ``pattern``; an AssertionError with the output if none comes."""
        deadline, seen = time.monotonic() + timeout, 0
        with self._changed:
            while True:
                for line in self._lines[seen:]:
                    if match := pattern.search(line):
                        return match
                seen = len(self._lines)
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    why = f"exited with {self.proc.wait()}" if self._closed else f"printed none in {timeout:.0f} s"
                    raise AssertionError(f"the server {why}; expected a line matching {pattern.pattern!r}:\n"
                                         + "\n".join(self._lines[-60:]))
                self._changed.wait(min(left, 1.0))

    def wait_answering(self, url: str, timeout: float) -> None:
        """Until ``url`` answers 200; an AssertionError with the output if the server exits or never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.output()[-6000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:  # not accepting yet (or mid-start): asked again below
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server did not answer {url} in {timeout:.0f} s:\n{self.output()[-6000:]}")

    def stop(self, grace: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(grace)


@contextmanager
def server_process(command: Sequence[str], *, url_line: re.Pattern[str], health: str, timeout: float = 120,
                   env: dict[str, str] | None = None, cwd: Path | None = None) -> Iterator[tuple[ServerProcess, str]]:
    """Start ``command``; yield it and its URL (``url_line``'s ``url`` group) once ``URL + health`` answers.

    The process is stopped on the way out (terminated, killed after a grace) unless it has already exited."""
    server = ServerProcess(subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            text=True, env=env, cwd=cwd))
    try:
        deadline = time.monotonic() + timeout
        url = server.wait_for(url_line, timeout)["url"]
        assert not url.endswith(":0"), f"the server printed port 0 as its address: {url}"
        server.wait_answering(url + health, max(1.0, deadline - time.monotonic()))
        yield server, url
    finally:
        server.stop()
