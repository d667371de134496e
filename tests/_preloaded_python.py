"""``python SCRIPT ARGS...`` without paying for the imports each time: a child forked from a process that made them.

A test that runs the same script many times in fresh processes (a training
run killed with SIGKILL and resumed, tests/test_crash_resume.py; the ``mtrl``
commands and Python blocks of a docs page, tests/test_docs.py) spends about
7 s of CPU per process importing torch, transformers, Strands and the
runtime before the script's first line. ``PreloadedPython`` starts this
module once as a server: it imports the named modules, then forks one child
per request. The child is the script's process: its own pid (a SIGKILL it
sends itself kills it alone), ``sys.argv`` and ``sys.path[0]`` as ``python
SCRIPT`` sets them, the script run as ``__main__``, the requester's stdin,
stdout and stderr, working folder and environment, and Python's normal exit
(``atexit``, finalization) with the script's status. ``run`` answers as
``subprocess.run(..., capture_output=True, text=True)`` does: the exit code
(minus the signal that ended it), the two outputs, ``TimeoutExpired`` past
the timeout (the child is killed).

What the child does not get is a fresh interpreter: the modules named in
``preload`` are already imported (their import-time state is what a fresh
import leaves, since the server runs nothing else), and ``random`` is reseeded
at the fork as Python does for every fork. So that what those modules read
at import stays true, a request whose environment differs from the one the
server was started with (other than the shell's own ``PWD``, ``OLDPWD``,
``SHLVL`` and ``_``) is refused, and its requester runs a fresh process
instead (``request`` returns None); what the imports themselves set in the
environment (MLflow names a telemetry session) the child gets, as a fresh
process's imports would set it. The server freezes what it imported out of
the garbage collector's reach (``gc.freeze``) before its first fork, so that
a child's collections leave those objects, and the memory pages they sit on,
shared with the server. The server refuses to fork once a thread other than
its own is running (a fork copies only the calling thread).

Protocol: the server listens on a Unix socket (``PreloadedPython.socket``)
and serves any number of requests at once. A requester connects and sends
one JSON object and a newline, ``{"argv", "cwd", "env"}`` (``env`` may be
null: the server's), with its three standard streams' file descriptors
attached (``SCM_RIGHTS``); the server answers ``{"pid"}`` at the fork (or
``{"refused": why}``) and ``{"returncode"}`` when the child ended. A
requester that hangs up first has its child killed. The server ends at the
end of its stdin, killing any child still running.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

SHELL_OWN = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})  # set by the shell that starts a command; read by no import
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # a shim passes these on to its child


class PreloadedPython:
    """A server process that imported ``preload`` and forks one child per request (module docstring)."""

    def __init__(self, preload: list[str], workdir: Path, env: dict[str, str] | None = None,
                 socket_env: str | None = None, absent: list[str] = ()) -> None:
        """``socket_env``: the name of a variable that the server's environment (``self.env``) sets to its socket.
        ``absent``: modules that ``preload`` must not import (the server fails before its first fork if it did)."""
        self.workdir = workdir
        self.runs = 0
        self.socket = Path(tempfile.mkdtemp(prefix="mtrl-preloaded-")) / "socket"  # short: AF_UNIX's 107 bytes
        self.env = {**(os.environ if env is None else env), **({socket_env: str(self.socket)} if socket_env else {})}
        self.server = subprocess.Popen([sys.executable, __file__, str(self.socket), *preload,
                                        *(f"!{name}" for name in absent)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env)
        assert self.server.stdout is not None
        if self.server.stdout.readline().strip() != "listening":  # bound before its imports: seconds away
            raise RuntimeError(f"the preloaded python server exited {self.server.wait()} before listening")

    def run(self, script: Path, *args: str, timeout: float, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``subprocess.run([python, script, *args], capture_output=True, text=True, timeout=...)``, forked."""
        self.runs += 1
        out, err = self.workdir / f"run-{self.runs}.stdout", self.workdir / f"run-{self.runs}.stderr"
        argv = [str(script), *args]
        with open(os.devnull, "rb") as stdin, open(out, "wb") as stdout, open(err, "wb") as stderr:
            started = request(self.socket, argv, str(cwd or os.getcwd()), env, (stdin, stdout, stderr), timeout)
        if started is None:  # another environment: a fresh process, as it would have been
            return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        pid, wait = started
        try:
            returncode = wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            wait(60)
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text()) from None
        return subprocess.CompletedProcess(argv, returncode, out.read_text(), err.read_text())

    def close(self) -> None:
        if self.server.stdin is not None:
            self.server.stdin.close()  # the server's loop ends at end of input
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        self.socket.unlink(missing_ok=True)
        self.socket.parent.rmdir()

    def __enter__(self) -> PreloadedPython:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def request(path: Path | str, argv: list[str], cwd: str, env: dict[str, str] | None, streams: tuple[Any, Any, Any],
            timeout: float) -> tuple[int, Callable[[float], int]] | None:
    """Ask the server at ``path`` to run ``argv`` with ``streams`` (objects with ``fileno()``) as its 0, 1, 2.

    The child's pid and a function that waits (at most its argument, in
    seconds) for the exit code; or None where the server refused (another
    environment), and the caller runs a fresh process. ``timeout`` bounds the
    wait for the fork, which includes the server's imports on its first
    request, as a fresh process would spend them.
    """
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    message = json.dumps({"argv": argv, "cwd": cwd, "env": env}).encode() + b"\n"
    try:
        conn.connect(str(path))
        socket.send_fds(conn, [message], [s.fileno() for s in streams])
    except (ConnectionRefusedError, BrokenPipeError, ConnectionResetError) as exc:  # it ended before reading it
        conn.close()
        raise RuntimeError(f"the preloaded python server hung up without answering ({exc})") from None
    replies = _Replies(conn)
    started = replies.next(timeout)
    if "refused" in started:
        conn.close()
        return None
    return int(started["pid"]), lambda seconds: int(replies.next(seconds)["returncode"])


class _Replies:
    """The server's answers on one connection, a JSON object a line."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer = conn, b""

    def next(self, timeout: float) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("preloaded python", timeout)
            try:
                more = self.conn.recv(4096)
            except ConnectionResetError:  # it died with the request unread
                more = b""
            if not more:
                raise RuntimeError("the preloaded python server hung up without answering")
            self.buffer += more
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


# ------------------------------------------------------------------------------------------------------ the server


def _serve(path: str, names: list[str]) -> None:
    """Bind, import the ``names`` (those with ``!`` must stay unimported), then fork a child per request until
    stdin ends (module docstring)."""
    import importlib

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("listening", flush=True)
    started = dict(os.environ)
    for name in names:
        if not name.startswith("!"):
            importlib.import_module(name)
    # what the imports set in the environment (MLflow names a telemetry session): a request is compared with the
    # environment the server started with, and its child gets these as a fresh process's imports would set them
    added = {k: v for k, v in os.environ.items() if started.get(k) != v}
    loaded = [name[1:] for name in names if name.startswith("!") and name[1:] in sys.modules]
    if loaded:
        raise RuntimeError(f"the preloaded python's imports loaded {loaded}, which must stay unimported")
    import gc

    # The imports' objects move to the collector's permanent generation: a child's collections then never visit
    # them, so they stay shared with this process instead of being copied page by page (copy-on-write) as the
    # collector writes to each object's header. Measured with bench/preloaded_fork.py: an empty script's child
    # cost 1.5 s of CPU without this, 0.31 s with it (its finalization, which a fresh python's exit also does).
    gc.collect()
    gc.freeze()
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wakeup pipe
    children: dict[int, socket.socket] = {}  # pid -> the connection its exit code goes to
    killed: set[int] = set()  # children whose requester hung up, not yet reaped
    open_fds = [listener.fileno(), wakeup_r, wakeup_w]
    while True:
        watched = [c for pid, c in children.items() if pid not in killed]
        ready, _, _ = select.select([0, listener, wakeup_r, *watched], [], [])
        if 0 in ready and not os.read(0, 4096):
            break
        if wakeup_r in ready:
            os.read(wakeup_r, 4096)
            _reap(children)
            killed &= set(children)
        for conn in [c for c in ready if isinstance(c, socket.socket) and c is not listener]:
            if not conn.recv(1, socket.MSG_PEEK):  # its requester hung up: its child goes too
                pid = next(p for p, c in children.items() if c is conn)
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        if listener in ready:
            conn, _ = listener.accept()
            child = _fork(conn, [*open_fds, *(c.fileno() for c in children.values())], started, added)
            if child is not None:
                children[child] = conn
    for pid in list(children):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    listener.close()


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass  # its requester is gone
            conn.close()


def _fork(conn: socket.socket, server_fds: list[int], started: dict[str, str], added: dict[str, str]) -> int | None:
    """Read one request from ``conn`` and fork its child; the child's pid, or None where it was refused."""
    import threading

    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise RuntimeError("a requester hung up in the middle of its request")
        data += more
    request = json.loads(data)
    env = request["env"]
    differs = _differs(env, started) if env is not None else []
    if differs:
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"refused": f"environment differs in {differs}"}).encode() + b"\n")
        conn.close()
        return None
    if threading.active_count() != 1:
        raise RuntimeError(f"the preloaded python runs {threading.active_count()} threads; a fork copies only one: "
                           f"{[t.name for t in threading.enumerate()]}")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request, fds, [*server_fds, conn.fileno()], added)
        sys.exit(0)  # the script returned without calling sys.exit
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _differs(env: dict[str, str], own: dict[str, str]) -> list[str]:
    return sorted(k for k in set(env) | set(own) if k not in SHELL_OWN and env.get(k) != own.get(k))


def _child(request: dict[str, Any], fds: list[int], server_fds: list[int], added: dict[str, str]) -> None:
    """In the forked child: become ``python SCRIPT ARGS`` and run the script as ``__main__``, then exit as it would."""
    import runpy

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in server_fds:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    if request["env"] is not None:
        os.environ.clear()
        os.environ.update({**added, **request["env"]})
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = str(Path(script).resolve().parent)
    try:
        runpy.run_path(script, run_name="__main__")  # its sys.exit propagates: Python's normal exit
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # reported from the script's first frame on, as a fresh interpreter reports it
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        exc.__traceback__ = tb or exc.__traceback__
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2:])
