"""An event loop on its own thread, so that an engine's async state serves callers on any loop or thread.

The coordinator's server, the trainer and tests may each call an engine
from their own event loop. An engine whose state is asyncio objects (an
``httpx.AsyncClient``, locks, events) keeps it on one ``LoopThread`` and
runs every public call there; the caller awaits the result on its own loop,
and cancelling that await cancels the work on the engine's loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one event loop; :meth:`run` executes a coroutine there."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the thread's loop and await its result from the caller's loop."""
        if self.on_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def stop(self) -> None:
        """Stop the loop and join the thread (call it from outside the loop)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


__all__ = ["LoopThread"]
