"""The host side of a sandbox's one way out: a unix socket whose every connection goes to the coordinator.

A sandbox without network (its own network namespace, or a container on
``--network none``) gets the socket ``run/coordinator.sock`` mounted
read-only at ``/run/mtrl``; inside, ``_inside.py`` listens on
``127.0.0.1:<the coordinator's port>`` and carries each connection to this
socket; here each is carried to the coordinator's TCP address, and to no
other: the sandbox names no destination. So code inside uses the
coordinator's URL with host ``127.0.0.1``, as the rollout hands it out,
and reaches nothing else.

Threads, not the event loop: the relay must keep carrying a harness's model
calls while the agent's loop waits on it, and must not depend on that loop.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

from ._inside import pump



def coordinator_address(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``http://host:port`` coordinator URL; an error naming it otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"coordinator: expected an http://host:port URL, got {url!r}")
    host = parts.hostname
    if host in ("0.0.0.0", "::", ""):  # a wildcard bind is reached on loopback
        host = "127.0.0.1"
    return host, parts.port or 80


def inside_url(url: str) -> str:
    """The coordinator's URL as code inside the sandbox uses it: the same port and path, on 127.0.0.1."""
    parts = urlsplit(url)
    _, port = coordinator_address(url)
    return f"http://127.0.0.1:{port}{parts.path}".rstrip("/")


class CoordinatorRelay:
    """Listens on ``socket_path``; carries each connection to ``(host, port)``; ``close`` ends them all."""

    def __init__(self, socket_path: Path, host: str, port: int) -> None:
        self.socket_path = Path(socket_path)
        self.host, self.port = host, port
        self._server: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.connections = 0

    def start(self) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)  # the sandbox may run as another uid
        server.listen(128)
        self._server = server
        threading.Thread(target=self._accept, name=f"mtrl-relay-{self.socket_path.parent.parent.name}",
                         daemon=True).start()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                inner, _ = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._carry, args=(inner,), daemon=True).start()

    def _carry(self, inner: socket.socket) -> None:
        try:
            outer = socket.create_connection((self.host, self.port), timeout=10)
            outer.settimeout(None)
        except OSError:
            inner.close()
            return
        with self._lock:
            if self._closed:
                inner.close()
                outer.close()
                return
            self._open.update((inner, outer))
            self.connections += 1
        back = threading.Thread(target=pump, args=(outer, inner), daemon=True)
        back.start()
        pump(inner, outer)  # the same byte pump the relay inside the sandbox runs
        back.join()
        with self._lock:
            self._open.difference_update((inner, outer))
        inner.close()
        outer.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._open = list(self._open), set()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


__all__ = ["CoordinatorRelay", "coordinator_address", "inside_url"]
