"""What a person watching a run sees between step lines: rollouts done/total, turns, tool calls, errors, and the
reward reports the coordinator refused (when there were some).

The ``Dispatcher`` keeps a ``RolloutTally`` per step (rollouts planned,
ended, ended other than completed); turns and tool calls come from the
coordinator's ``counters``: for a step, the step's own (``turns_by_step``:
rollouts an asynchronous run collected ahead of the step, before its
``mark``, count for it); outside steps, those counted since the last
``mark``. A ``Heartbeat`` turns both into one line, and ``run`` emits that
line every ``every_s`` seconds until cancelled (training, evaluation)::

    beat = Heartbeat(dispatcher.tally, coordinator.counters, print, every_s=30)
    beat.mark("step 1/10", key=0)
    task = asyncio.create_task(beat.run())
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable

from ..coordinator import CoordinatorCounters
from ..types import RolloutStatus

HEARTBEAT_S = 30.0  # the longest a non-terminal run stays silent during a step
_COUNTED = ("turns", "tool_calls", "rewards_refused")  # the coordinator's counters a line shows, since the mark


@dataclass
class RolloutTally:
    """Rollouts planned, ended and ended badly, per key (a training step; None outside steps)."""

    planned: Counter = field(default_factory=Counter)
    done: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)

    def plan(self, key: Hashable, n: int) -> None:
        self.planned[key] += n

    def record(self, key: Hashable, status: RolloutStatus) -> None:
        self.done[key] += 1
        if status is not RolloutStatus.COMPLETED:
            self.errors[key] += 1


class Heartbeat:
    """A progress line for the phase begun at the last ``mark``, emitted every ``every_s`` seconds by ``run``."""

    def __init__(
        self,
        tally: RolloutTally,
        counters: CoordinatorCounters,
        emit: Callable[[str], None],
        every_s: float = HEARTBEAT_S,
    ) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s: must be > 0, got {every_s}")
        self.tally, self.counters, self.emit, self.every_s = tally, counters, emit, every_s
        self.label: str = "rollouts"
        self.key: Hashable = None
        self._since: dict[str, int] = {}
        self._started = time.monotonic()

    def mark(self, label: str, key: Hashable = None) -> None:
        """A new phase (a step): lines now count from here and count the tally under ``key``."""
        self.label, self.key = label, key
        self._since = {k: self.counters[k] for k in _COUNTED}
        self._started = time.monotonic()

    def _since_mark(self, name: str) -> int:
        return self.counters[name] - self._since.get(name, 0)

    def line(self) -> str:
        key = self.key
        if key is None:  # outside steps: what the coordinator counted since the mark
            turns, calls = self._since_mark("turns"), self._since_mark("tool_calls")
        else:  # a step: its own rollouts' turns and tool calls, wherever they were counted
            turns, calls = self.counters.turns_by_step[key], self.counters.tool_calls_by_step[key]
        refused = self._since_mark("rewards_refused")
        return (f"{self.label}: rollouts {self.tally.done[key]}/{self.tally.planned[key]} done, turns {turns}, "
                f"tool calls {calls}, errors {self.tally.errors[key]}"
                + (f", rewards refused {refused}" if refused else "")
                + f" ({time.monotonic() - self._started:.0f} s)")

    async def run(self) -> None:
        """Emit ``line()`` every ``every_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.every_s)
            self.emit(self.line())


__all__ = ["HEARTBEAT_S", "Heartbeat", "RolloutTally"]
