"""An ASGI layer that bounds how requests send their bodies, and logs a client's hang-up as one line.

- A request body must arrive within ``body_timeout_s`` of the first read:
  past it, the read raises ``RequestTimeout`` (a 408 in OpenAI's error shape)
  and the connection is freed. Without it, a client that sends headers and
  half a body held a connection and a task forever.
- At most ``max_pending_bodies`` requests may be waiting for the rest of
  their body at once; one more is refused at once with a 503
  (``ServerBusy``), so half-sent requests cannot pile up without bound.
- A client that hangs up before its body is read has no one to answer: the
  request ends with one log line (``mtrl.server``, INFO), not Starlette's
  ``ClientDisconnect`` traceback of some 60 lines.

Its cost on a request whose body arrives whole (every normal call): one
counter and one ``asyncio.timeout`` around the single ``receive``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.requests import ClientDisconnect

from ..errors import RequestTimeout, ServerBusy
from ._asgi import ClientGone, Receive, Send

log = logging.getLogger("mtrl.server")

ASGIApp = Any


class BodyGuard:
    """Wraps an ASGI app: body-read deadline, bounded half-open requests, one-line hang-ups."""

    def __init__(self, app: ASGIApp, body_timeout_s: float = 30.0, max_pending_bodies: int = 512) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.max_pending_bodies = max_pending_bodies
        self.pending = 0  # requests waiting for (the rest of) their body now
        self.timed_out = 0
        self.refused = 0
        self.hung_up = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        done = False

        async def guarded_receive() -> dict[str, Any]:
            nonlocal done
            if done:  # the body is in: later receives wait for a disconnect (streaming), unbounded
                return await receive()
            if self.pending >= self.max_pending_bodies:
                self.refused += 1
                raise ServerBusy(
                    f"{self.pending} requests are still sending their bodies (advanced.server.max_pending_bodies="
                    f"{self.max_pending_bodies}); retry shortly", param="body",
                )
            self.pending += 1
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                self.timed_out += 1
                raise RequestTimeout(
                    f"the request body did not arrive within {self.body_timeout_s:g} s "
                    "(advanced.server.body_timeout_s)", param="body",
                ) from None
            finally:
                self.pending -= 1
            if message["type"] != "http.request" or not message.get("more_body", False):
                done = True
            return message

        try:
            await self.app(scope, guarded_receive, send)
        except (ClientDisconnect, ClientGone):
            self.hung_up += 1
            log.info("mtrl: client %s hung up before its %s %s request was read; nothing was recorded",
                     _peer(scope), scope.get("method"), scope.get("path"))


def _peer(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


__all__ = ["BodyGuard"]
