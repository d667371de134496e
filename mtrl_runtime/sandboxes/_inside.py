"""Runs inside a sandbox: listen on 127.0.0.1:PORT, carry each connection to the coordinator's socket, exec.

    python3 /run/mtrl/relay.py PORT /run/mtrl/coord.sock COMMAND [ARG...]

Standard library only (it is copied into each sandbox and run by the
sandbox's own Python). The listening socket is bound before COMMAND starts,
so its first request cannot race the relay. The relay runs in a grandchild
(its parent is the sandbox's init, not COMMAND, which never sees it as a
child); it ends when the sandbox's process namespace does, or when the
sandbox is removed. Nothing here chooses a destination: the socket is the
only one, and the host side of it reaches only the coordinator.
"""

import os
import socket
import sys
import threading


def pump(src, dst):
    """Copy ``src`` to ``dst`` until ``src`` ends, then end ``dst``'s writing side (the relay on the host uses it too)."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def carry(conn, path):
    try:
        out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        out.connect(path)
    except OSError:
        conn.close()
        return
    back = threading.Thread(target=pump, args=(out, conn), daemon=True)
    back.start()
    pump(conn, out)
    back.join()
    conn.close()
    out.close()


def listeners(port):
    found = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            found.append(sock)
        except OSError:
            if family == socket.AF_INET:
                raise
    return found


def serve(sock, path):
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=carry, args=(conn, path), daemon=True).start()


def main(argv):
    port, path, command = int(argv[1]), argv[2], argv[3:]
    socks = listeners(port)
    child = os.fork()
    if child == 0:
        if os.fork() != 0:
            os._exit(0)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        for sock in socks[1:]:
            threading.Thread(target=serve, args=(sock, path), daemon=True).start()
        try:
            serve(socks[0], path)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    for sock in socks:
        sock.close()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"{command[0]}: {exc.strerror}\n")
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv)
