"""Plain ASGI plumbing for the hot route: request headers, a size-limited body, one-write responses."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping

from ._http import check_declared_size, check_read_size

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class ClientGone(Exception):
    """The client disconnected before its request body was read; there is no one to answer."""


def request_headers(scope: Mapping[str, Any]) -> dict[bytes, bytes]:
    """Lower-case header names to values; the first of repeated headers wins (as in Starlette)."""
    return dict(reversed(scope["headers"]))


async def read_body(receive: Receive, declared: bytes | None, max_bytes: int) -> bytes:
    """The whole request body, refused (413) past ``max_bytes`` whether or not its length was declared."""
    check_declared_size(None if declared is None else declared.decode("latin-1"), max_bytes)
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        check_read_size(size, max_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_body(send: Send, status: int, body: bytes, content_type: bytes, headers: Mapping[str, str]) -> None:
    """The whole response in one start message and one body message (one socket write)."""
    raw = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    raw.extend((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items())
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


__all__ = ["ClientGone", "Receive", "Send", "read_body", "request_headers", "send_body"]
