"""``python SCRIPT ARGS...`` without paying for the imports each time: a child forked from a process that made them.

A test that runs the same script many times in fresh processes (a training
run killed with SIGKILL and resumed, tests/test_crash_resume.py) spends about
7 s of CPU per process importing torch, transformers, Strands and the
runtime before the script's first line. ``PreloadedPython`` starts this
module once as a server: it imports the named modules, then forks one child
per ``run``. The child is the script's process: its own pid (a SIGKILL it
sends itself kills it alone), ``sys.argv`` and ``sys.path[0]`` as ``python
SCRIPT`` sets them, the script run as ``__main__``, stdout and stderr in
files, and Python's normal exit (``atexit``, finalization) with the script's
status. ``run`` answers as ``subprocess.run(..., capture_output=True,
text=True)`` does: the exit code (minus the signal that ended it), the two
outputs, ``TimeoutExpired`` past the timeout (the child is killed).

What the child does not get is a fresh interpreter: the modules named in
``preload`` are already imported (their import-time state is what a fresh
import leaves, since the server runs nothing else), and ``random`` is reseeded
at the fork as Python does for every fork. The server refuses to fork once a
thread other than its own is running (a fork copies only the calling thread).

Protocol on the server's stdin/stdout, one JSON object a line: a request
``{"script", "args", "stdout", "stderr"}``; the answers ``{"pid"}`` at the
fork and ``{"returncode"}`` when the child ended.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any


class PreloadedPython:
    """A server process that imported ``preload`` and forks one child per ``run`` (module docstring)."""

    def __init__(self, preload: list[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.runs = 0
        self.server = subprocess.Popen([sys.executable, __file__, *preload], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env=env)

    def run(self, script: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
        self.runs += 1
        out, err = self.workdir / f"run-{self.runs}.stdout", self.workdir / f"run-{self.runs}.stderr"
        request = {"script": str(script), "args": list(args), "stdout": str(out), "stderr": str(err)}
        assert self.server.stdin is not None
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        pid = self._answer(timeout, "pid")  # the first run also waits for the server's imports, as a fresh one would
        try:
            returncode = self._answer(timeout, "returncode")
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self._answer(60, "returncode")
            raise subprocess.TimeoutExpired([script, *args], timeout, out.read_text(), err.read_text()) from None
        return subprocess.CompletedProcess([str(script), *args], returncode, out.read_text(), err.read_text())

    def _answer(self, timeout: float, key: str) -> int:
        assert self.server.stdout is not None
        ready, _, _ = select.select([self.server.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired(self.server.args, timeout)
        line = self.server.stdout.readline()
        if not line:
            raise RuntimeError(f"the preloaded python server exited {self.server.wait()} instead of answering {key!r}")
        return int(json.loads(line)[key])

    def close(self) -> None:
        if self.server.stdin is not None:
            self.server.stdin.close()  # the server's loop ends at end of input
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()

    def __enter__(self) -> PreloadedPython:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become ``python SCRIPT ARGS`` and run the script as ``__main__``, then exit as it would."""
    import runpy

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = str(Path(request["script"]).resolve().parent)
    runpy.run_path(request["script"], run_name="__main__")  # its sys.exit propagates: Python's normal exit


def _serve(preload: list[str]) -> None:
    for name in preload:
        importlib.import_module(name)
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        if threading.active_count() != 1:
            raise RuntimeError(f"the preloaded python runs {threading.active_count()} threads; a fork copies only one: "
                               f"{[t.name for t in threading.enumerate()]}")
        replies.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
            sys.exit(0)  # the script returned without calling sys.exit
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve(sys.argv[1:])
