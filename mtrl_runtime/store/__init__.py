"""The trajectory store: tasks, rollouts, turns, tool calls and training history of a run.

``TrajectoryStore`` is the protocol (``mtrl_runtime.types``); a backend is
one folder here satisfying it, and one line in ``STORES`` (name -> factory
of a path). ``sqlite`` is the run's store: one SQLite file (WAL) in the run
folder, one writer that group-commits, and a write returns once it is
durable. ``memory`` is the test double::

    store = open_store("runs/x/trajectories.db")            # SQLiteStore
    store.put_task(task)
    store.create_rollout(Rollout(id=rollout_id, task_id=task.id, group_id=group_id), hash_token(token))
    await store.aadd_turn(turn)            # committed before the response is sent
    store.finish_rollout(rollout_id, RolloutStatus.COMPLETED)
    store.export_jsonl("runs/x/rollouts.jsonl")
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..registry import Registry
from ..types import TrajectoryStore
from ._codec import hash_token
from .memory import MemoryStore
from .sqlite import SQLiteStore

StoreFactory = Callable[[str | Path], TrajectoryStore]

STORES: Registry[StoreFactory] = Registry("store backend")
STORES.register("sqlite")(SQLiteStore)
STORES.register("memory")(MemoryStore)


def open_store(path: str | Path, backend: str = "sqlite") -> TrajectoryStore:
    """The store of backend ``backend`` at ``path``; an unknown backend is a KeyError listing the known ones."""
    return STORES.get(backend)(path)


__all__ = ["STORES", "SQLiteStore", "TrajectoryStore", "hash_token", "open_store"]
