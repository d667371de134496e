"""An event loop on its own thread, so that an engine's async state serves callers on any loop or thread.

The coordinator's server, the trainer and tests may each call an engine
from their own event loop. An engine whose state is asyncio objects (an
``httpx.AsyncClient``, locks, events) keeps it on one ``LoopThread`` and
runs every public call there; the caller awaits the result on its own loop,
and cancelling that await cancels the work on the engine's loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, AsyncGenerator, AsyncIterator, Coroutine, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)
_CLOSE_WAIT_S = 10.0  # how long closing a stream waits for the generator's cleanup on the thread's loop


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

    async def stream(self, agen: AsyncGenerator[T, None]) -> AsyncIterator[T]:
        """Iterate ``agen`` on the thread's loop, handing each item to the caller's loop as it is made.

        ``agen``'s error is raised to the caller. Closing the returned iterator
        early (``aclose``, or cancelling its consumer) cancels ``agen`` where it
        waits and returns once its cleanup ran (at most ``_CLOSE_WAIT_S``).
        """
        if self.on_loop():
            try:
                async for item in agen:
                    yield item
            finally:
                await agen.aclose()
            return
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def hand(kind: str, value: Any = None) -> None:
            try:
                caller.call_soon_threadsafe(queue.put_nowait, (kind, value))
            except RuntimeError:
                pass  # the caller's loop is closed: nobody is waiting for the item

        async def pump() -> None:
            try:
                async for item in agen:
                    hand("item", item)
                hand("end")
            except Exception as exc:
                hand("error", exc)
            finally:
                await agen.aclose()
                hand("closed")

        future = asyncio.run_coroutine_threadsafe(pump(), self.loop)
        closed = False
        try:
            while True:
                kind, value = await queue.get()
                if kind == "item":
                    yield value
                elif kind == "error":
                    raise value
                elif kind == "end":
                    return
                else:
                    closed = True
                    return
        finally:
            future.cancel()  # a no-op once pump() returned
            if not closed:

                async def cleaned_up() -> None:
                    while (await queue.get())[0] != "closed":
                        pass

                try:
                    await asyncio.wait_for(cleaned_up(), _CLOSE_WAIT_S)
                except asyncio.TimeoutError:  # the caller goes on; the source may still hold its connection open
                    logger.warning("a closed stream's source did not finish its cleanup on %s within %.0f s: its "
                                   "connection (and the server's request) may still be open", self._thread.name,
                                   _CLOSE_WAIT_S)

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
