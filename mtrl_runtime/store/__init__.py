"""The trajectory store: tasks, rollouts, turns, tool calls and training history of a run.

One SQLite file (WAL) in the run folder, e.g. ``runs/x/trajectories.db``;
one writer thread group-commits, and a write returns once it is durable::

    store = TrajectoryStore("runs/x/trajectories.db")
    store.put_task(task)
    store.create_rollout(Rollout(id=rid, task_id=task.id, group_id=gid), hash_token(token))
    await store.aadd_turn(turn)            # committed before the response is sent
    store.finish_rollout(rid, RolloutStatus.COMPLETED)
    store.export_jsonl("runs/x/rollouts.jsonl")
"""

from ._sqlite import TrajectoryStore, hash_token

__all__ = ["TrajectoryStore", "hash_token"]
