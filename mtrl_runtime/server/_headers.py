"""A deadline on each request's line and headers: uvicorn has none, so slow headers are bounded here.

uvicorn (0.54) bounds a request's header *size* (httptools' parser limits),
and idle keep-alive connections after a response (``timeout_keep_alive``),
but nothing bounds the time a client takes to send the request line and
headers: a connection that sends a byte now and then, or none at all after
connecting, was held forever (the ASGI app, and so ``_guard``'s body
deadline, only starts once the headers are complete). This protocol is
uvicorn's httptools protocol plus one timer per connection: armed when the
connection opens and when a request's first byte arrives, cancelled when the
headers are complete; when it fires the connection is closed, with one log
line. Cost on a normal request: one ``call_later`` and one ``cancel``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("mtrl.server")

HEADER_TIMEOUT_S = 10.0


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on the request line and headers (see the module docstring)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            log.info("mtrl: closed a connection from %s: its request line and headers did not arrive within "
                     "advanced.server.header_timeout_s=%g s", self.client, self.header_timeout_s)
            self.transport.close()


def header_deadline_protocol(header_timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for uvicorn's ``Config(http=...)`` with this deadline."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s: must be > 0, got {header_timeout_s!r}")
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": float(header_timeout_s)})


__all__ = ["HEADER_TIMEOUT_S", "HeaderDeadlineProtocol", "header_deadline_protocol"]
