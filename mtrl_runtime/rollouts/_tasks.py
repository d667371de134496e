"""Training data: tasks from JSONL or rows, and the deterministic order batches are drawn in.

The order is a pure function of the seed: epoch ``e`` visits every task once
in the permutation ``Random(f"{seed}:{e}")`` gives, and step ``t`` takes the
prompts at positions ``[t * B, (t + 1) * B)`` of the concatenated epochs. So
the data position of a run is simply the number of prompts drawn, a resumed
run draws exactly the batches the crashed one would have, and an async run
that draws step ``t + 1`` early draws the same tasks a sync run would.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..types import Task


def task_from_row(row: Mapping[str, Any], index: int = 0) -> Task:
    """A Task from a dataset row: ``id`` (default ``task-<index>``), ``prompt`` or ``messages``,
    ``ground_truth``, ``split``, and every other key kept in ``data``."""
    if not isinstance(row, Mapping):
        raise ValueError(f"dataset row {index}: expected a JSON object, got {type(row).__name__}")
    prompt, messages = row.get("prompt"), row.get("messages")
    if prompt is None and messages is None:
        raise ValueError(f"dataset row {index}: needs a 'prompt' or 'messages' field, got keys {sorted(row)}")
    known = {"id", "prompt", "messages", "ground_truth", "split", "data"}
    data = dict(row.get("data") or {})
    data.update({k: v for k, v in row.items() if k not in known})
    return Task(
        id=str(row.get("id", f"task-{index}")),
        prompt=prompt,
        messages=tuple(messages) if messages is not None else None,
        ground_truth=row.get("ground_truth"),
        split=str(row.get("split", "train")),
        data=data,
    )


def load_tasks(source: str | Path | Iterable[Task | Mapping[str, Any]]) -> list[Task]:
    """Tasks from a JSONL file (one row per line) or from Tasks / row dicts; ids must be unique."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"dataset: {str(source)!r} is not a file (expected a JSONL file of tasks)")
        rows: list[Any] = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"dataset {path}: line {number} is not JSON: {exc}") from None
    else:
        rows = list(source)
    tasks = [row if isinstance(row, Task) else task_from_row(row, i) for i, row in enumerate(rows)]
    if not tasks:
        raise ValueError(f"dataset: {source!r} holds no tasks")
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise ValueError(f"dataset: task id {task.id!r} appears more than once")
        seen.add(task.id)
    return tasks


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

    def position(self, step: int) -> dict[str, int]:
        """The data position before step ``step``: prompts drawn, and where in which epoch."""
        drawn = step * self.batch_size
        epoch, offset = divmod(drawn, len(self.tasks))
        return {"prompts_drawn": drawn, "epoch": epoch, "offset": offset}


__all__ = ["TaskSchedule", "load_tasks", "task_from_row"]
