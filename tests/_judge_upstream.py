"""A judge model's own endpoint for the tests: OpenAI chat completions on 127.0.0.1, answering ``SCORE 1``.

A real HTTP server (``ThreadingHTTPServer``) that records every call it gets
(path, headers, body): a test reads from it how many judge calls reached the
judge and with which key. Streamed (``stream: true``) and plain answers,
with usage.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

USAGE = (17, 3)  # the judge's input / output tokens, as its answers say them


class _Judge(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.calls.append({"path": self.path, "headers": dict(self.headers), "body": body})
        usage = {"prompt_tokens": USAGE[0], "completion_tokens": USAGE[1], "total_tokens": sum(USAGE)}
        head = {"id": "j1", "created": 0, "model": body.get("model")}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "SCORE 1"}
            return self._send(json.dumps({**head, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "finish_reason": "stop", "message": message}]}).encode(), "application/json")
        chunk = {**head, "object": "chat.completion.chunk"}
        events = [{**chunk, "choices": [{"index": 0, "finish_reason": None,
                                         "delta": {"role": "assistant", "content": "SCORE 1"}}]},
                  {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                  {**chunk, "choices": [], "usage": usage}]
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(data.encode(), "text/event-stream")

    def _send(self, data: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # 20 rollouts ask at once; the default backlog (5) can refuse some under load
    daemon_threads = True


@contextmanager
def judge_upstream() -> Iterator[Any]:
    """The judge's endpoint; ``.url`` is its OpenAI base URL (``.../v1``), ``.calls`` what it received."""
    server = _Server(("127.0.0.1", 0), _Judge)
    server.calls = []  # type: ignore[attr-defined]
    server.url = f"http://127.0.0.1:{server.server_address[1]}/v1"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
