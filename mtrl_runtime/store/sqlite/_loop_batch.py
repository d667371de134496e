"""Group commit on the event loop: the writes one loop iteration awaits are committed together.

The first async write of an iteration schedules a flush with ``call_soon``;
every write the other ready tasks make before the flush runs joins it (at 32
concurrent rollouts, a dozen turns a transaction). The flush hands the batch
to the ``Writer`` as one transaction (each write in its own savepoint, so a
refused write undoes only itself) and each awaiter resumes once the batch has
committed: a write is still durable when its await returns. There is no
thread hand-off when the writer is idle, and no wake-up pipe: the awaiters
are resolved on their own loop.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Future

from ._writer import Operation, Writer


class LoopBatch:
    """Collects async writes per event loop and flushes each loop's batch once per iteration."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        # loop -> its writes waiting for the flush; each loop touches only its own entry
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Operation, asyncio.Future]]] = {}

    def submit(self, op: Operation) -> asyncio.Future:
        """Queue ``op`` for this iteration's flush; the future resolves once it is committed.

        Cancelling the future (its awaiter was cancelled) does not cancel the write.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        batch = self._pending.get(loop)
        if batch is None:
            batch = self._pending[loop] = []
            loop.call_soon(self._flush, loop)
        batch.append((op, future))
        return future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._pending.pop(loop)
        try:
            done = self._writer.submit_many([op for op, _ in batch])
        except RuntimeError as exc:  # the store was closed meanwhile
            for _, future in batch:
                _resolve(future, None, exc)
            return
        for (_, future), committed in zip(batch, done):
            if committed.done():  # committed inline, on this thread
                _copy(future, committed)
            else:  # queued behind the writer thread's transaction
                committed.add_done_callback(functools.partial(_copy_threadsafe, loop, future))


def _copy_threadsafe(loop: asyncio.AbstractEventLoop, future: asyncio.Future, committed: Future) -> None:
    try:
        loop.call_soon_threadsafe(_copy, future, committed)
    except RuntimeError:  # the loop has closed: nobody waits for this write any more
        pass


def _copy(future: asyncio.Future, committed: Future) -> None:
    error = committed.exception()
    _resolve(future, None if error is not None else committed.result(), error)


def _resolve(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    if future.done():  # cancelled by its awaiter; the write happened all the same
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


__all__ = ["LoopBatch"]
