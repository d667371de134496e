"""``MemoryStore``: the ``TrajectoryStore`` test double, in plain dicts, gone with the process.

It validates and encodes through the same codec as ``SQLiteStore``
(``store._codec``), so it refuses the same values with the same messages
and reads back the same values; it checks what depends on recorded data
(unknown ids, a final status, a trained rollout) as ``sqlite/_ops`` does.
One lock makes every call atomic; a write is "durable" when it returns.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ...types import ModelCall, Rollout, RolloutStatus, Task, ToolCall, Turn
from .._checks import check_int, check_metrics, check_rollout_ids, check_str, check_untrained, final_status
from .._codec import (
    decode_rollout,
    decode_task,
    decode_tool_call,
    decode_turn,
    dumps,
    encode_rollout,
    encode_task,
    encode_tool_call,
    encode_turn,
    loads,
)
from .._export import rollout_record, write_jsonl
from .._front import RewardRow, StoreFront
from .._model_calls import decode_model_call, encode_model_call


@dataclass
class _Recorded:
    """One rollout as recorded: the rollout without turns, and what hangs off it."""

    rollout: Rollout
    token_hash: str
    turns: dict[int, Turn] = field(default_factory=dict)
    tool_calls: list[ToolCall] = field(default_factory=list)
    model_calls: list[ModelCall] = field(default_factory=list)
    trained_step: int | None = None

    def full(self) -> Rollout:
        turns = tuple(self.turns[i] for i in sorted(self.turns))
        return replace(
            self.rollout, turns=turns, tool_calls=tuple(self.tool_calls), model_calls=tuple(self.model_calls)
        )


class MemoryStore(StoreFront):
    """The ``memory`` ``TrajectoryStore``: every record in dicts; ``path`` is only a label.

    ``read_only``: there is nothing to read back (a memory store keeps nothing
    once its process ends), so asking for one is an error naming the path.
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False) -> None:
        if read_only:
            raise ValueError(f"store backend 'memory' keeps nothing once its process ends: there is no store at "
                             f"{str(path)!r} to read; a run recorded with core.store: memory cannot be read back")
        self.path = None if path is None else Path(path)
        self._lock = threading.RLock()
        self._closed = False
        self._tasks: dict[str, tuple] = {}  # id -> encoded row
        self._rollouts: dict[str, _Recorded] = {}  # in creation order
        self._metrics: list[tuple[int, str, float]] = []
        self._meta: dict[str, str] = {}  # key -> JSON text

    # ---- writes ----------------------------------------------------------

    def put_task(self, task: Task) -> None:
        self.put_tasks([task])

    def put_tasks(self, tasks: Iterable[Task]) -> None:
        """Record tasks; a task already recorded under the same id is replaced."""
        rows = [encode_task(t) for t in tasks]
        with self._open():
            self._tasks.update((row[0], row) for row in rows)

    def create_rollout(self, rollout: Rollout, token_hash: str) -> None:
        """A new rollout of a recorded task, with any turns and tool calls it already holds."""
        row = encode_rollout(rollout, token_hash)
        turns = [decode_turn(encode_turn(t)) for t in rollout.turns]
        calls = [encode_tool_call(c) for c in rollout.tool_calls]
        for name, owner in [("turns", t.rollout_id) for t in rollout.turns] + [
            ("tool_calls", c.rollout_id) for c in rollout.tool_calls
        ]:
            if owner != rollout.id:
                raise ValueError(f"rollout.{name}: holds an entry of rollout {owner!r}, not {rollout.id!r}")
        with self._open():
            if rollout.id in self._rollouts:
                raise ValueError(f"rollout.id {rollout.id!r} is already recorded")
            if rollout.task_id not in self._tasks:
                raise ValueError(f"rollout.task_id {rollout.task_id!r} is not a recorded task; put_task it first")
            recorded = _Recorded(decode_rollout(row), token_hash)
            for turn in sorted(turns, key=lambda t: t.index):
                _add_turn(recorded, turn)
            for call in calls:
                _add_tool_call(recorded, call)
            self._rollouts[rollout.id] = recorded

    def add_turn(self, turn: Turn) -> None:
        """A turn of a running rollout; its index must be new to the rollout."""
        decoded = decode_turn(encode_turn(turn))
        with self._open():
            recorded = self._recorded("turn.rollout_id", decoded.rollout_id)
            status = recorded.rollout.status
            if status.is_final:
                raise ValueError(
                    f"rollout {decoded.rollout_id!r} is {status.value}; turn.index {decoded.index} cannot be added"
                )
            _add_turn(recorded, decoded)

    async def aadd_turn(self, turn: Turn) -> None:
        self.add_turn(turn)

    def add_tool_call(self, call: ToolCall) -> int:
        """A tool call of a rollout not yet trained; returns its sequence number in the rollout."""
        row = encode_tool_call(call)
        with self._open():
            recorded = self._untrained("tool_call.rollout_id", row[0], "tool calls")
            return _add_tool_call(recorded, row)

    async def aadd_tool_call(self, call: ToolCall) -> int:
        return self.add_tool_call(call)

    async def aadd_model_call(self, call: ModelCall) -> int:
        """A non-policy model call of a rollout not yet trained; returns its sequence number in the rollout."""
        row = encode_model_call(call)
        with self._open():
            recorded = self._untrained("model_call.rollout_id", row[0], "model calls")
            seq = len(recorded.model_calls)  # order of arrival, as the sqlite writer assigns it
            recorded.model_calls.append(decode_model_call((row[0], seq, *row[1:])))
            return seq

    def _store_reward(self, row: RewardRow) -> bool:
        rollout_id, value, turns_json, metrics_json, defaulted = row
        with self._open():
            recorded = self._untrained("rollout_id", rollout_id, "reward")
            current = recorded.rollout
            if defaulted and (current.reward is not None or current.turn_rewards is not None):
                return False
            rewards = loads(turns_json)
            recorded.rollout = replace(
                current, reward=value, turn_rewards=None if rewards is None else tuple(rewards),
                metrics=json.loads(metrics_json), reward_defaulted=defaulted,
            )
            return True

    async def _astore_reward(self, row: RewardRow) -> bool:
        return self._store_reward(row)

    def finish_rollout(self, rollout_id: str, status: RolloutStatus | str, error: str | None = None) -> bool:
        """Give a running rollout its final status; returns False (nothing changed) if it had one."""
        check_str("rollout_id", rollout_id)
        final = final_status("status", status)
        check_str("error", error, optional=True, empty=True)
        with self._open():
            recorded = self._recorded("rollout_id", rollout_id)
            if recorded.rollout.status.is_final:
                return False
            recorded.rollout = replace(recorded.rollout, status=final, error=error, finished_at=time.time())
            return True

    async def afinish_rollout(self, rollout_id: str, status: RolloutStatus | str, error: str | None = None) -> bool:
        return self.finish_rollout(rollout_id, status, error)

    def mark_trained(self, rollout_ids: Sequence[str], step: int) -> None:
        """Record that update ``step`` consumed these rollouts: all or nothing, and never twice."""
        ids = check_rollout_ids("rollout_ids", rollout_ids)
        check_int("step", step)
        with self._open():
            missing = [rollout_id for rollout_id in ids if rollout_id not in self._rollouts]
            if missing:
                raise ValueError(f"rollout_ids: unknown rollout ids {missing[:10]!r}")
            found = [self._rollouts[rollout_id] for rollout_id in ids]
            twice = {r.rollout.id: r.trained_step for r in found if r.trained_step is not None}
            if twice:
                raise ValueError(f"rollout_ids: already trained (id: step) {dict(list(twice.items())[:10])!r}")
            running = [r.rollout.id for r in found if not r.rollout.status.is_final]
            if running:
                raise ValueError(f"rollout_ids: still running, cannot be trained {running[:10]!r}")
            for recorded in found:
                recorded.trained_step = step

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append training metrics of ``step`` to the history."""
        check_int("step", step)
        rows = [(step, name, value) for name, value in check_metrics("metrics", metrics).items()]
        with self._open():
            self._metrics.extend(rows)

    def set_meta(self, key: str, value: Any) -> None:
        """Store a JSON value under ``key``."""
        check_str("key", key)
        text = dumps(f"meta[{key!r}]", value)
        with self._open():
            self._meta[key] = text

    def flush(self) -> None:
        """Every write is in place when it returns: nothing to wait for."""
        with self._open():
            pass

    # ---- reads -----------------------------------------------------------

    def get_task(self, task_id: str) -> Task | None:
        with self._open():
            row = self._tasks.get(task_id)
        return None if row is None else decode_task(row)

    def get_rollout(self, rollout_id: str, with_turns: bool = True) -> Rollout | None:
        """The rollout, with its turns and tool calls unless ``with_turns`` is False."""
        with self._open():
            recorded = self._rollouts.get(rollout_id)
            if recorded is None:
                return None
            return recorded.full() if with_turns else recorded.rollout

    def _select_rollouts(
        self, step: int | None, status: RolloutStatus | None, group_id: str | None, untrained_only: bool,
        with_turns: bool,
    ) -> list[Rollout]:
        with self._open():
            return [
                r.full() if with_turns else r.rollout
                for r in self._rollouts.values()
                if (step is None or r.rollout.step == step)
                and (status is None or r.rollout.status is status)
                and (group_id is None or r.rollout.group_id == group_id)
                and not (untrained_only and r.trained_step is not None)
            ]

    def count_turns(self, rollout_id: str) -> int:
        with self._open():
            recorded = self._rollouts.get(rollout_id)
            return 0 if recorded is None else len(recorded.turns)

    def count_tool_calls(self, rollout_id: str) -> int:
        with self._open():
            recorded = self._rollouts.get(rollout_id)
            return 0 if recorded is None else len(recorded.tool_calls)

    def token_hash(self, rollout_id: str) -> str | None:
        """The sha256 of the rollout's bearer token, or None for an unknown rollout."""
        with self._open():
            recorded = self._rollouts.get(rollout_id)
            return None if recorded is None else recorded.token_hash

    def trained_step(self, rollout_id: str) -> int | None:
        """The update step that consumed the rollout, or None if not trained yet."""
        with self._open():
            return self._recorded("rollout_id", rollout_id).trained_step

    def metric_history(self, name: str | None = None) -> list[tuple[int, str, float]]:
        """``(step, name, value)`` in step order, of one metric or of all."""
        with self._open():
            rows = [row for row in self._metrics if name is None or row[1] == name]
        return sorted(rows, key=lambda row: row[0])  # stable: a step's rows in the order logged

    def get_meta(self, key: str, default: Any = None) -> Any:
        with self._open():
            text = self._meta.get(key)
        return default if text is None else json.loads(text)

    def export_jsonl(self, path: str | Path, step: int | None = None) -> int:
        """One JSON line per rollout (format in ``mtrl_runtime.store._export``); returns the count."""
        with self._open():
            return write_jsonl(path, self._export_records(step))

    # ---- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Refuse every later call. Idempotent."""
        with self._lock:
            self._closed = True

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> threading.RLock:
        """The lock, once it is known the store is open."""
        if self._closed:
            raise RuntimeError("the trajectory store is closed")
        return self._lock

    def _recorded(self, field_name: str, rollout_id: str) -> _Recorded:
        recorded = self._rollouts.get(rollout_id)
        if recorded is None:
            raise ValueError(f"{field_name}: unknown rollout id {rollout_id!r}")
        return recorded

    def _untrained(self, field_name: str, rollout_id: str, what: str) -> _Recorded:
        """The recorded rollout, refused once an update trained on it (``what`` it was to change stays as it is)."""
        recorded = self._recorded(field_name, rollout_id)
        check_untrained(rollout_id, recorded.trained_step, what)
        return recorded

    def _export_records(self, step: int | None) -> Iterator[dict[str, Any]]:
        for recorded in list(self._rollouts.values()):
            if step is None or recorded.rollout.step == step:
                task = self._tasks.get(recorded.rollout.task_id)
                task_record = None if task is None else decode_task(task)
                yield rollout_record(recorded.full(), task_record, recorded.trained_step)


def _add_turn(recorded: _Recorded, turn: Turn) -> None:
    if turn.index in recorded.turns:
        raise ValueError(f"turn.index {turn.index} of rollout {turn.rollout_id!r} is already recorded")
    recorded.turns[turn.index] = turn


def _add_tool_call(recorded: _Recorded, row: tuple) -> int:
    seq = len(recorded.tool_calls)  # order of arrival, as the sqlite writer assigns it
    recorded.tool_calls.append(decode_tool_call((row[0], seq, *row[1:])))
    return seq
