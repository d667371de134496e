"""The trajectory store: tasks, rollouts, turns, tool calls and training history of a run.

``TrajectoryStore`` is the protocol (``mtrl_runtime.types``); a backend is
one folder here satisfying it, and one line in ``STORES`` (name -> factory
of a path). ``core.store`` picks the backend a run records into
(``rollouts.RolloutStack`` opens it); ``sqlite`` is the default: one SQLite
file (WAL) in the run folder (``RunFolder.store``), one writer that
group-commits, and a write returns once it is durable. ``memory`` is the
test double, kept in the process. A run read back from its folder (rescore,
export, warm start) is read from that file, ``read_only``::

    store = open_store("runs/x/trajectories.db")            # SQLiteStore
    store.put_task(task)
    store.create_rollout(Rollout(id=rollout_id, task_id=task.id, group_id=group_id), hash_token(token))
    await store.aadd_turn(turn)            # committed before the response is sent
    store.finish_rollout(rollout_id, RolloutStatus.COMPLETED)
    store.export_jsonl("runs/x/rollouts.jsonl")
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..registry import Registry
from ..types import TrajectoryStore
from ._codec import hash_token
from .memory import MemoryStore
from .sqlite import SQLiteStore

class StoreFactory(Protocol):
    """A backend's constructor: the store at ``path``; ``read_only`` opens what is there and refuses writes."""

    def __call__(self, path: str | Path, *, read_only: bool = False) -> TrajectoryStore: ...


STORES: Registry[StoreFactory] = Registry("store backend")
STORES.register("sqlite")(SQLiteStore)
STORES.register("memory")(MemoryStore)

DEFAULT_STORE = "sqlite"  # core.store's default, and the backend a run folder's store file is read with


def open_store(path: str | Path, backend: str = DEFAULT_STORE, *, read_only: bool = False) -> TrajectoryStore:
    """The store of backend ``backend`` at ``path``; an unknown backend is a KeyError listing the known ones."""
    factory = STORES.get(backend)
    return factory(path, read_only=True) if read_only else factory(path)


# DEFAULT_STORE and StoreFactory are for the config and the backends, not the public door
__all__ = ["STORES", "SQLiteStore", "TrajectoryStore", "hash_token", "open_store"]
