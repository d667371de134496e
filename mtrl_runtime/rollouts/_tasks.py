"""Training data: tasks from a dataset (``task_sources``), and the deterministic order batches are drawn in.

The order is a pure function of the seed: epoch ``e`` visits every task once
in the permutation ``Random(f"{seed}:{e}")`` gives, and step ``t`` takes the
prompts at positions ``[t * B, (t + 1) * B)`` of the concatenated epochs. So
the data position of a run is simply the number of prompts drawn, a resumed
run draws exactly the batches the crashed one would have, and an async run
that draws step ``t + 1`` early draws the same tasks a sync run would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..task_sources import read_tasks, task_from_row
from ..types import Task


def load_tasks(source: str | Path | Iterable[Task | Mapping[str, Any]] | Any) -> list[Task]:
    """Tasks from a dataset: ``PATH`` or ``PATH::SPLIT`` (.jsonl, .json, .csv, .parquet, .arrow, a
    ``save_to_disk`` folder), a ``datasets.Dataset`` / ``DatasetDict`` or pandas DataFrame, or Tasks / row
    dicts; ids must be unique. Every bad row is listed in one ``DatasetError`` (a ValueError).
    See ``task_sources`` and docs/datasets.md."""
    return read_tasks(source)


@dataclass(frozen=True)
class TaskSchedule:
    """Which tasks step ``t`` trains on: ``batch_size`` prompts in a seeded, epoch-wise order."""

    tasks: tuple[Task, ...]
    batch_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("tasks: the schedule needs at least one task")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")

    @classmethod
    def of(cls, tasks: Sequence[Task], batch_size: int, seed: int = 0) -> "TaskSchedule":
        return cls(tuple(tasks), batch_size, seed)

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def batch(self, step: int) -> list[Task]:
        """The tasks of step ``step`` (0-based), in order; a task appears at most once per epoch."""
        if step < 0:
            raise ValueError(f"step: must be >= 0, got {step}")
        n = len(self.tasks)
        orders: dict[int, list[int]] = {}  # a batch spans at most a few epochs
        out = []
        for position in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, offset = divmod(position, n)
            if epoch not in orders:
                orders[epoch] = self._order(epoch)
            out.append(self.tasks[orders[epoch][offset]])
        return out

    def refill(self, step: int, start: int, count: int) -> list[Task]:
        """Extra tasks ``start .. start + count - 1`` drawn to refill step ``step`` (dynamic sampling).

        A stream of its own per step, a pure function of (seed, step, index):
        epoch ``e`` of it visits every task not in ``batch(step)`` (every task
        when the batch holds them all) once, in the order ``Random(f"{seed}:refill:{step}:{e}")``
        gives. It never moves the data position: step ``t + 1``'s batch does not
        depend on how many extra tasks step ``t`` drew.
        """
        if step < 0 or start < 0 or count < 0:
            raise ValueError(f"refill: step, start and count must be >= 0, got {step}, {start}, {count}")
        in_batch = {t.id for t in self.batch(step)}
        pool = [i for i, t in enumerate(self.tasks) if t.id not in in_batch] or list(range(len(self.tasks)))
        orders: dict[int, list[int]] = {}
        out = []
        for index in range(start, start + count):
            epoch, offset = divmod(index, len(pool))
            if epoch not in orders:
                orders[epoch] = list(pool)
                random.Random(f"{self.seed}:refill:{step}:{epoch}").shuffle(orders[epoch])
            out.append(self.tasks[orders[epoch][offset]])
        return out

    def position(self, step: int) -> dict[str, int]:
        """The data position before step ``step``: prompts drawn, and where in which epoch."""
        drawn = step * self.batch_size
        epoch, offset = divmod(drawn, len(self.tasks))
        return {"prompts_drawn": drawn, "epoch": epoch, "offset": offset}


__all__ = ["TaskSchedule", "load_tasks", "task_from_row"]
