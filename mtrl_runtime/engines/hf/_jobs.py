"""The handoff between ``generate`` callers (event loops) and the hf engine's worker thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable

from ...torch_support import settle_future
from ...types import Generation, GenerationRequest


class Job:
    """One request in flight: its future lives on the caller's loop, the worker settles it.

    A streamed job (``stream=True``) also gets each sampled token on ``tokens``
    as (id, logprob), then None once the future is settled.
    """

    __slots__ = ("request", "future", "loop", "cancelled", "tokens")

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, stream: bool = False) -> None:
        self.request = request
        self.loop = loop
        self.future: asyncio.Future[Generation] = loop.create_future()
        self.cancelled = False  # set by the caller when it stops waiting; the worker drops the row
        self.tokens: asyncio.Queue[tuple[int, float] | None] | None = asyncio.Queue() if stream else None

    def emit(self, token: int, logprob: float) -> None:
        """Hand one sampled token to a streaming caller (from the worker thread; a no-op for other jobs)."""
        if self.tokens is None or self.cancelled:
            return
        try:
            self.loop.call_soon_threadsafe(self.tokens.put_nowait, (token, logprob))
        except RuntimeError:  # the caller's loop is closed: nobody is waiting
            pass

    def settle(self, result: Generation | None, error: BaseException | None = None) -> None:
        """Resolve the future from any thread (a no-op if it is already done)."""
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, result, error, self.tokens)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting
            pass


class Call:
    """A function the worker runs between decode steps; its result or error goes to ``future``.

    ``drain``: run it only once no row is being decoded (admitting no new row
    meanwhile), so a weight change it makes never reaches a turn in flight.
    """

    __slots__ = ("fn", "future", "drain")

    def __init__(self, fn: Callable[[], Any], drain: bool = False) -> None:
        self.fn = fn
        self.drain = drain
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result, error = self.fn(), None
        except BaseException as exc:  # handed to the caller, who re-raises it
            result, error = None, exc
        settle_future(self.future, result, error)

    def settle(self, result: Any, error: BaseException | None = None) -> None:
        """Fail (or resolve) the call without running it: the engine closed first."""
        if self.future.done() or not self.future.set_running_or_notify_cancel():
            return
        settle_future(self.future, result, error)


def _settle(
    future: asyncio.Future, result: Generation | None, error: BaseException | None, tokens: asyncio.Queue | None = None
) -> None:
    if tokens is not None:  # after every token the worker emitted: the stream's end
        tokens.put_nowait(None)
    if not future.done():
        settle_future(future, result, error)


__all__ = ["Call", "Job"]
