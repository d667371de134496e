"""Connections that never finish their headers, against ``mtrl serve``: are they closed, and is the descriptor freed?

Starts ``mtrl serve`` (scripted engine, its default ``advanced.server.header_timeout_s`` of 10 s) in its own
process, opens ``--connections`` sockets that each send a request line and half the headers, then counts the
server's open file descriptors right after and again past the deadline, and how many sockets the server
closed. Ends the server with SIGINT and reports its exit status and whether it printed a traceback.

    .venv/bin/python bench/half_open_headers.py [--connections 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

from _machine import machine_info

SERVING = re.compile(r"on http://127\.0\.0\.1:(\d+)/v1")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main(connections: int, wait_s: float) -> dict:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "mtrl_runtime.cli", "serve", "--engine", "scripted",
                                 "--port", "0", "--run-dir", f"{tmp}/run"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        port = next(int(m.group(1)) for line in proc.stdout if (m := SERVING.search(line)))
        at_start = descriptors(proc.pid)
        socks = []
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line that ends them
            socks.append(sock)
        time.sleep(1)
        held = descriptors(proc.pid)
        time.sleep(wait_s)
        after = descriptors(proc.pid)
        closed = 0
        for sock in socks:
            sock.setblocking(False)
            try:
                closed += sock.recv(16) == b""
            except BlockingIOError:
                pass
            sock.close()
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=60)[0]
    return {"command": f"python bench/half_open_headers.py --connections {connections}", "connections": connections,
            "descriptors_at_start": at_start, "descriptors_held": held, f"descriptors_after_{wait_s:g}_s": after,
            "closed_by_server": closed, "exit_status_on_sigint": proc.returncode,
            "traceback_printed": "Traceback" in output,
            "machine": machine_info(load_before, os.getloadavg(), 0, dtype="none (scripted engine: no model runs)")}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--wait-s", type=float, default=12.0, help="past the 10 s header deadline")
    parser.add_argument("--out", default="bench/results/half_open_headers.json")
    args = parser.parse_args()
    report = main(args.connections, args.wait_s)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
