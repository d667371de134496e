"""A run's stop and the model calls still generating: both halves of the one protocol between them.

``stoppable`` runs a call's generation (the engine's, a reference endpoint's
answer) with its task in its rollout's ``LiveRollout.generating``;
``stop_generating`` marks the rollout stopped and cancels every task there,
so a stopped rollout's end, which waits for its own call's lock, is written at
once and a harness's background calls beside it stop too. Either side may run
on another thread: each sets its own field before reading the other's, so one
sees the other.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Awaitable, Callable, TypeVar

from ..errors import Conflict

if TYPE_CHECKING:
    from ._live import LiveRollout

T = TypeVar("T")


async def stoppable(live: LiveRollout, work: Callable[[], Awaitable[T]]) -> T:
    """``work()``, which the run's stop cancels (``stop_generating``): a 409 naming the stop, no turn recorded. No
    task of its own (that costs every call a loop iteration): the stop cancels this call's task while it waits
    here, and only here."""
    task = asyncio.current_task()
    live.generating.add(task)  # before reading ``stopped``: a stop on another thread sets it, then reads this
    try:
        if live.stopped:  # stopped before the call got here (between taking the lock and here)
            raise _stopped(live)
        return await work()
    except asyncio.CancelledError:
        if not live.stopped or _cancelled_by_others():
            raise
        raise _stopped(live) from None
    finally:
        live.generating.discard(task)


def stop_generating(live: LiveRollout) -> None:
    """The run stopped ``live``: cancel its generations in flight (the engine drops the row at its next step; a
    reference endpoint's request is closed) and refuse one about to start. Each cancel runs on its task's loop and
    only if the task still waits in ``stoppable`` (it may have moved on to record its turn meanwhile); ``list``
    copies the set in one step under the GIL."""
    live.stopped = True
    for task in list(live.generating):
        task.get_loop().call_soon_threadsafe(_cancel_if_generating, live, task)


def _cancel_if_generating(live: LiveRollout, task: asyncio.Task) -> None:
    if task in live.generating:
        task.cancel()


def _stopped(live: LiveRollout) -> Conflict:
    return Conflict(f"rollout {live.rollout_id!r} was stopped (the run stopped) while this call was being generated; "
                    "no turn was recorded", param="rollout_id")


def _cancelled_by_others() -> bool:
    """After the stop's cancel was caught: whether another cancel of this task is pending too (its client went
    away, the server shuts down); then it propagates. Python 3.10 has no ``Task.uncancel`` to count them: there
    the stop's cancel is taken for the only one."""
    task = asyncio.current_task()
    if task is None or sys.version_info < (3, 11):
        return False
    return task.uncancel() > 0


__all__ = ["stop_generating", "stoppable"]
