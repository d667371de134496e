"""A worker that answers chat completions by calling the coordinator's ASGI app in process, no socket in between.

Started by ``endpoint_trees --asgi`` with ``PYTHONPATH`` set to the source
tree to measure; it builds ``create_app(Coordinator(scripted engine, SQLite
store))`` from that tree's public API and reads one JSON command a line from
stdin: ``{"n": 300, "stream": false}`` runs ``n`` first turns of ``n`` fresh
rollouts, one after the other, each ``await app(scope, receive, send)``
exactly as uvicorn calls it, and prints one JSON line: the latencies, the
process CPU seconds over the calls (``time.process_time``: this process only,
no HTTP parsing), the wall time and the answers that were not a 200 ending as
expected. The rollouts are created through the coordinator, untimed, and
left live (the same in both trees). Without the network and the client the figure is the route, the
capture path and the store: what a change to the route moves, with less
noise than a loaded machine's sockets add.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


async def _call(app: Any, path: str, body: bytes, token: str) -> tuple[int, bytes]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Future()  # the client never hangs up; cancelled when the answer is written
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def main() -> None:
    from mtrl_runtime.coordinator import Coordinator
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.server import create_app
    from mtrl_runtime.store import SQLiteStore
    from mtrl_runtime.testing import tiny_tokenizer
    from mtrl_runtime.types import Task

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from endpoint_overhead import MESSAGES, TOOLS

    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "trajectories.db")
        coordinator = Coordinator(ScriptedEngine(tiny_tokenizer(), lambda request, prompt: "DONE"), store)
        app = create_app(coordinator)
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            n, stream = command["n"], command["stream"]
            body = json.dumps({"model": "policy", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 64,
                               "stream": stream,
                               **({"stream_options": {"include_usage": True}} if stream else {})}).encode()
            end = b"[DONE]" if stream else b"}"
            rollouts = [coordinator.create_rollout(Task(id=f"t{i % 50}", prompt="inspect")) for i in range(n)]
            latencies, errors = [], 0
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for rollout in rollouts:
                t0 = time.perf_counter()
                status, answer = await _call(app, f"/rollouts/{rollout.rollout_id}/v1/chat/completions", body,
                                             rollout.token)
                latencies.append(time.perf_counter() - t0)
                errors += not (status == 200 and answer.rstrip().endswith(end))
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            print(json.dumps({"latencies": latencies, "cpu_s": cpu, "wall_s": wall, "errors": errors}), flush=True)
        store.close()


if __name__ == "__main__":
    asyncio.run(main())
