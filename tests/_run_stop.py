"""Stop a run while one of a rollout's calls is in flight, and time what the stop waited for."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from mtrl_runtime.types import RunStopped


async def stop_while_in_flight(coordinator: Any, rollout_id: str, call: Awaitable[Any],
                               reached: Callable[[], bool]) -> tuple[float, BaseException | Any]:
    """Start ``call`` (a model call of ``rollout_id``), wait until ``reached()`` says it got where it waits (the
    engine, a reference endpoint), stop the rollout as a run's stop does (``RunStopped``), and return the seconds
    from the stop until the call ended and what it ended with (its result, or the exception it raised)."""
    task = asyncio.ensure_future(call)
    while not reached():
        assert not task.done(), f"the call ended before it got there: {task.result()!r}"
        await asyncio.sleep(0.02)
    started = time.monotonic()
    assert await coordinator.end(rollout_id, RunStopped())
    ended = (await asyncio.gather(task, return_exceptions=True))[0]
    return time.monotonic() - started, ended
