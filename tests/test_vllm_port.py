"""The port mtrl's vLLM server starts on: a server found answering there that is not the one started is an error.

No vLLM here: ``VLLMServer`` runs ``python -m vllm.entrypoints.openai.api_server`` with this
interpreter and a stand-in ``vllm`` package on PYTHONPATH, which either serves ``/health`` on
the port it is given (as vLLM does, with ``SO_REUSEPORT``) or never binds it (a vLLM still
importing, or one that lost the port). The process on the other side is a real HTTP server.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from mtrl_runtime.engines.vllm._ports import foreign_listeners, held_sockets, listening_sockets
from mtrl_runtime.engines.vllm._server import VLLMServer, VLLMServerError

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net (Linux)")

STAND_IN = '''
import argparse, socket, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
if "{mode}" == "never-binds":
    time.sleep(600)


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


class Server(HTTPServer):
    def server_bind(self):  # as vLLM binds its socket
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


Server((args.host, args.port), Health).serve_forever()
'''


def _stand_in(root: Path, mode: str) -> dict[str, str]:
    """A ``vllm`` package under ``root`` whose api_server behaves as ``mode`` says; the env that finds it."""
    package = root / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(STAND_IN.replace("{mode}", mode))
    return {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:  # quiet: the test reads nothing from it
        pass


@pytest.fixture
def other_server() -> Iterator[int]:
    """Another process's web server, as a test would meet it: a real HTTP server answering /health 200."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def _start(server: VLLMServer) -> None:
    server.start()
    try:
        async with httpx.AsyncClient() as http:
            await server.wait_healthy(http, 60)
    finally:
        await asyncio.to_thread(server.stop)


def test_the_sockets_a_process_listens_on_are_read_from_proc() -> None:
    with socket.socket() as listener, socket.socket() as bound_only:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        bound_only.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listening = listening_sockets(port)
        assert listening and len(listening) == 1
        assert listening <= held_sockets(os.getpid())
        assert foreign_listeners(os.getpid(), port) == set()
        assert listening_sockets(bound_only.getsockname()[1]) == set()  # bound, not listening
        assert foreign_listeners(1, port) == listening  # a process that does not hold it
    assert listening_sockets(port) == set()
    assert listening_sockets(port, tables=("/nonexistent/tcp",)) is None  # /proc cannot say: not a verdict


async def test_a_server_answering_on_the_port_before_vllm_binds_it_is_named_not_trusted(tmp_path, other_server):
    server = VLLMServer(tmp_path / "model", python=sys.executable, port=other_server,
                        env=_stand_in(tmp_path / "stand-in", "never-binds"), log_path=tmp_path / "vllm.log")
    with pytest.raises(VLLMServerError, match=rf"another process listens on port {other_server} .* may not be the "
                                              rf"vLLM server mtrl started \(pid \d+\); name a port nothing else "
                                              rf"uses in the engine option port"):
        await _start(server)
    assert not server.alive()


async def test_the_started_server_answering_on_its_port_is_trusted(tmp_path):
    server = VLLMServer(tmp_path / "model", python=sys.executable,
                        env=_stand_in(tmp_path / "stand-in", "serves"), log_path=tmp_path / "vllm.log")
    await _start(server)
    assert server.starts == 1 and not server.alive()


async def test_a_listener_sharing_the_picked_port_with_vllm_is_named(tmp_path):
    server = VLLMServer(tmp_path / "model", python=sys.executable,  # no port: one is picked
                        env=_stand_in(tmp_path / "stand-in", "serves"), log_path=tmp_path / "vllm.log")
    with socket.socket() as sharer:  # what SO_REUSEPORT lets another process (same user) do beside vLLM
        sharer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sharer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sharer.bind(("127.0.0.1", server.port))
        sharer.listen()
        with pytest.raises(VLLMServerError, match=rf"another process listens on port {server.port} .*the port was "
                                                  rf"free when mtrl picked it; start again to pick another"):
            await _start(server)
