"""The port a vLLM server is started on, and whether what answers there is that server.

vLLM cannot be started on port 0 and asked which port it took: it binds the socket
itself and logs the port it was given. So the port is picked here (``free_port``)
and handed over, and in the seconds before vLLM binds it another process can take
it. Then that process's ``/health`` answers, and requests meant for the policy go
elsewhere. ``foreign_listeners`` tells the two apart on Linux from ``/proc``: the
sockets listening on the port that the server process does not hold (vLLM binds
with ``SO_REUSEPORT``, so another listener can share the port even after it).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_LISTEN = "0A"  # the LISTEN state in /proc/net/tcp
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def listening_sockets(port: int, tables: tuple[str, ...] = _TABLES) -> set[str] | None:
    """The inodes of the TCP sockets listening on ``port`` (IPv4 and IPv6); None where /proc has no table."""
    found: set[str] | None = None
    for table in tables:
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:  # no such table here (no IPv6, or not Linux): the other one may still say
            continue
        found = found or set()
        for row in rows:
            fields = row.split()
            if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def held_sockets(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open (empty when it has exited)."""
    held = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # the process has exited (or is not ours to read): it holds nothing we can see
        return held
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:  # closed between the listing and the read: not a listener of the process any more
            continue
        if target.startswith("socket:["):
            held.add(target[len("socket:["):-1])
    return held


def foreign_listeners(pid: int, port: int) -> set[str] | None:
    """Sockets listening on ``port`` that process ``pid`` does not hold; None where /proc cannot tell."""
    listening = listening_sockets(port)
    return None if listening is None else listening - held_sockets(pid)


__all__ = ["foreign_listeners", "free_port", "held_sockets", "listening_sockets"]
