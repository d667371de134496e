"""The handoff between ``generate`` callers (event loops) and the hf engine's worker thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable

from ...types import Generation, GenerationRequest


class Job:
    """One request in flight: its future lives on the caller's loop, the worker settles it."""

    __slots__ = ("request", "future", "loop", "cancelled")

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.future: asyncio.Future[Generation] = loop.create_future()
        self.cancelled = False  # set by the caller when it stops waiting; the worker drops the row

    def settle(self, result: Generation | None, error: BaseException | None = None) -> None:
        """Resolve the future from any thread (a no-op if it is already done)."""
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, result, error)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting
            pass


class Call:
    """A function the worker runs between decode steps; its result or error goes to ``future``."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn()
        except BaseException as exc:  # handed to the caller, who re-raises it
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)

    def settle(self, result: Any, error: BaseException | None = None) -> None:
        """Fail (or resolve) the call without running it: the engine closed first."""
        if self.future.done() or not self.future.set_running_or_notify_cancel():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


def _settle(future: asyncio.Future, result: Generation | None, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


__all__ = ["Call", "Job"]
