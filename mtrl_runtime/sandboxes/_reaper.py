"""The reaper: a process of its own that removes a run's sandboxes if the run dies without closing them.

A ``Sandboxes`` provider starts one (``Reaper.start``) in a session of its
own and writes it one JSON line per event on a pipe: a sandbox folder
opened (with its container, if any), a process started in it, a sandbox
closed. When the pipe reaches end of file (the provider closed it, or the
process holding it died, SIGKILL included), the reaper kills the recorded
process groups that still run (checked by start time, so a reused pid is
left alone), removes the containers, removes the folders, and exits.

Namespace sandboxes die with the run on their own (``--die-with-parent``);
the reaper is what removes their folders then, and what ends containers and
``tempdir`` processes, which nothing else would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from ._dirs import is_alive, remove_tree

CONTAINER_RM_S = 60.0


def _kill_group(pid: int, start: int | None) -> None:
    if is_alive(pid, start):
        for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass


def remove_container(runtime: str, name: str) -> None:
    """``<runtime> rm -f <name>``; a container already gone is fine."""
    try:
        subprocess.run([runtime, "rm", "-f", name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=CONTAINER_RM_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


def clean(path: str, entry: dict[str, Any]) -> None:
    """End what a sandbox left: its process groups, its container, its folder."""
    for pid, start in entry.get("pids", {}).items():
        _kill_group(int(pid), start)
    container = entry.get("container")
    if container:
        remove_container(container[0], container[1])
    try:
        remove_tree(Path(path))
    except OSError as exc:
        print(f"mtrl sandbox reaper: could not remove {path}: {exc}", file=sys.stderr)


def serve(lines: IO[str]) -> dict[str, dict[str, Any]]:
    """Follow the provider's events until end of file; returns the sandboxes still open then."""
    open_: dict[str, dict[str, Any]] = {}
    for line in lines:
        try:
            msg = json.loads(line)
            op, path = msg["op"], msg["path"]
        except (ValueError, KeyError, TypeError):
            continue
        if op == "add":
            open_[path] = {"pids": {}, "container": msg.get("container")}
        elif op == "pid" and path in open_:
            open_[path]["pids"][str(msg["pid"])] = msg.get("start")
        elif op == "container" and path in open_:
            open_[path]["container"] = msg.get("container")
        elif op == "done":
            open_.pop(path, None)
    return open_


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's Ctrl-C is not ours; end of file is
    left = serve(sys.stdin)
    threads = [threading.Thread(target=clean, args=(path, entry)) for path, entry in left.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class Reaper:
    """The provider's side: start the reaper process and tell it what opens and closes."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self.broken: str | None = None  # why events can no longer be sent (the reaper died)

    def start(self) -> None:
        code = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
                "from mtrl_runtime.sandboxes._reaper import main; main()")
        self._proc = subprocess.Popen(
            [sys.executable, "-s", "-c", code, json.dumps(sys.path)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=None, text=True, start_new_session=True, close_fds=True,
            cwd="/",
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def send(self, op: str, path: Path, **fields: Any) -> None:
        if self._proc is None or self._proc.stdin is None or self.broken:
            return
        line = json.dumps({"op": op, "path": str(path), **fields}) + "\n"
        with self._lock:
            try:
                self._proc.stdin.write(line)
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                self.broken = f"the sandbox reaper (pid {self._proc.pid}) is gone: {exc}"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Close the pipe: the reaper cleans what is still open (nothing, after a clean close) and exits."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        with self._lock:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


__all__ = ["Reaper", "clean", "main", "remove_container", "serve"]
