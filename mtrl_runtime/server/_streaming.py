"""A streamed answer written as its tokens are generated, whatever the protocol's events.

``stream_answer`` runs one call (``Coordinator.chat`` with a ``ChatStream``)
and writes each text delta as soon as it is decoded, with ASGI
``more_body=True`` sends (no content-length: the body ends when the call
does). The protocol's ``EventWriter`` turns the deltas and the final
``ChatResult`` into its own events (each protocol's, in ``wires``).

The closing events are the call's answer (``Coordinator.chat``'s
``respond``): built once every delta decoded so far is written, and before
the turn is committed, so a closing the protocol cannot write (a refusal,
a value the JSON writer refuses) is the protocol's error event with nothing
recorded; then the turn is committed and the closing events leave.

Nothing is sent until the engine produced the first token (or, for an
engine that does not stream, the whole completion), so a refusal (token,
body, limits, turn budget) or an engine failure before that is still an
ordinary error with its status, in the protocol's shape; the headers and
the opening events leave with the first token, its text or not. A failure
after that is the protocol's error event. A client that
hangs up stops the generation (``ChatStream.close``): that turn is not
recorded; the rollout's earlier turns stay and it goes on running.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Protocol

from ..chat import TextDelta
from ..coordinator import ChatStream, CoordinatorCounters, StreamClosed
from ..types import ChatResult
from ..errors import MtrlError
from ._asgi import Receive, Send

log = logging.getLogger("mtrl.server")

Run = Callable[[ChatStream, Callable[[ChatResult], Awaitable[bytes]]], Awaitable[bytes]]
"""The call: ``(stream, respond) -> Coordinator.chat(..., stream=stream, respond=respond)``."""


class EventWriter(Protocol):
    """One protocol's events of one streamed answer, as bytes."""

    content_type: bytes

    def opening(self, prompt_tokens: int) -> bytes: ...

    def text(self, delta: TextDelta) -> bytes: ...

    def closing(self, result: ChatResult) -> bytes: ...

    def error(self, exc: MtrlError) -> bytes: ...


async def stream_answer(
    run: Run, events: EventWriter, counters: CoordinatorCounters, receive: Receive, send: Send
) -> None:
    """Run the call and write its events as they come (see the module docstring).

    Raises ``MtrlError`` when the call is refused before anything was sent.
    """
    stream = ChatStream()
    written = asyncio.Event()  # every delta decoded before the closing is written: the events' state is final
    opened = started = False

    def head() -> bytes:
        """The opening events, once, ahead of whatever is written first (some protocols number their events)."""
        nonlocal opened
        if opened:
            return b""
        opened = True
        return events.opening(stream.prompt_tokens)

    async def closing(result: ChatResult) -> bytes:
        """The text not streamed yet and the closing events: the call's answer, built before its turn is committed."""
        stream.end()  # the generation is over: no delta comes after the ones queued
        await written.wait()
        # nothing streamed yet when no decoder began (a reference model's reply arrives whole): send it all
        rest = TextDelta(result.message.get("content") or "", result.message.get("reasoning_content") or "")
        if stream.text is not None:
            rest, exact = stream.text.remainder(result.message)
            if not exact:
                counters.stream_divergences += 1
                log.warning("mtrl: a streamed reply's text diverged from its final parse (%s); "
                            "the client holds the streamed text, the turn its ids", stream.text.content[:40])
        return head() + events.text(rest) + events.closing(result)

    async def write(data: bytes) -> None:
        nonlocal started
        if not started:
            started = True
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", events.content_type), (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": data, "more_body": True})

    task = asyncio.ensure_future(run(stream, closing))
    task.add_done_callback(stream.end)
    watcher = asyncio.ensure_future(_hang_up(receive, stream))
    try:
        while (delta := await stream.get()) is not None:
            if delta or not opened:
                await write(head() + events.text(delta))
        written.set()
        try:
            last = await task
        except StreamClosed:
            return  # the client is gone; the counter and the docstring say what was kept
        except MtrlError as exc:
            if not started:
                raise
            await write(head() + events.error(exc))
        else:
            await write(last)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()
        if not task.done():  # this handler itself was cancelled (the server stops)
            task.cancel()


async def _hang_up(receive: Receive, stream: ChatStream) -> None:
    """Wait for the client's disconnect (the body is read by now) and stop the stream's generation."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            stream.close()
            return




__all__ = ["EventWriter", "Run", "stream_answer"]
