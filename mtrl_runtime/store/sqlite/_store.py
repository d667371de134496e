"""``SQLiteStore``: everything a run records, in one SQLite (WAL) file in the run folder.

Writes are validated in the caller, then committed by the writer
(``_writer``: inline when idle, else by its group-committing thread); the
``a``-prefixed async twins are first gathered per event-loop iteration into
one transaction (``_loop_batch``). A write method returns (or its async twin
resolves) only once the write is committed, so a turn stored before its
response is sent survives the process being killed. Reads use
one connection per thread and see every write that has returned.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ...types import ModelCall, Rollout, RolloutStatus, Task, ToolCall, Turn
from .._checks import check_int, check_metrics, check_rollout_ids, check_str, final_status
from .._codec import dumps, encode_rollout, encode_task, encode_tool_call, encode_turn
from .._export import rollout_record, write_jsonl
from .._front import RewardRow, StoreFront
from .._model_calls import encode_model_call
from . import _ops, _reads
from ._model_calls import insert_model_call
from ._loop_batch import LoopBatch
from ._schema import connect, connect_reader, prepare, read_version
from ._writer import Operation, Writer

_RESERVED_META = frozenset({"schema_version"})
OFF_LOOP_PROMPT_TOKENS = 32768
"""A turn with a longer prompt is encoded on a worker thread: a 2.7 MB request's took 0.6 s of the event loop."""


class SQLiteStore(StoreFront):
    """The ``sqlite`` ``TrajectoryStore``: tasks, rollouts, turns, tool calls, metrics and meta of one run.

    Sync write methods block until committed; call the async ones
    (``aadd_turn``...) from an event loop. Opening an existing file keeps its
    data (resume). ``close()`` commits what is queued; the store is also a
    context manager. ``read_only=True`` opens an existing store for reading
    only (``mtrl rescore``): no writer, every write refused, the file untouched.
    """

    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        if read_only:
            self.schema_version = read_version(self.path)
            self._writer: Writer | _RefusedWrites = _RefusedWrites(self.path)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = connect(self.path)
            try:
                self.schema_version = prepare(conn)
            except BaseException:
                conn.close()
                raise
            self._writer = Writer(conn)
        self._batch = LoopBatch(self._writer)
        self._closed = False
        self._local = threading.local()
        self._readers: dict[int, tuple[weakref.ref, sqlite3.Connection]] = {}
        self._readers_lock = threading.Lock()

    # ---- writes: ``name`` waits, ``aname`` awaits, ``_name`` validates and binds the operation ----

    def put_task(self, task: Task) -> None:
        self.put_tasks([task])

    def put_tasks(self, tasks: Iterable[Task]) -> None:
        """Record tasks; a task already recorded under the same id is replaced."""
        rows = [encode_task(t) for t in tasks]
        self._write(_bind(_ops.upsert_tasks, rows))

    def create_rollout(self, rollout: Rollout, token_hash: str) -> None:
        """A new rollout of a recorded task, with any turns and tool calls it already holds.

        ``token_hash`` is the sha256 hex digest of the rollout's bearer token
        (``hash_token``); the token itself is never stored.
        """
        self._write(self._create_rollout(rollout, token_hash))

    async def acreate_rollout(self, rollout: Rollout, token_hash: str) -> None:
        await self._awrite(self._create_rollout(rollout, token_hash))

    def _create_rollout(self, rollout: Rollout, token_hash: str) -> Operation:
        row = encode_rollout(rollout, token_hash)
        turns = [encode_turn(t) for t in rollout.turns]
        calls = [encode_tool_call(c) for c in rollout.tool_calls]
        for field, owner in [("turns", t.rollout_id) for t in rollout.turns] + [
            ("tool_calls", c.rollout_id) for c in rollout.tool_calls
        ]:
            if owner != rollout.id:
                raise ValueError(f"rollout.{field}: holds an entry of rollout {owner!r}, not {rollout.id!r}")
        return _bind(_ops.insert_rollout, row, turns, calls)

    def add_turn(self, turn: Turn) -> None:
        """A turn of a running rollout; its index must be new to the rollout."""
        self._write(self._add_turn(turn))

    async def aadd_turn(self, turn: Turn) -> None:
        if len(turn.prompt_ids) > OFF_LOOP_PROMPT_TOKENS:  # encoding megabytes of messages: not on the event loop
            await self._awrite(await asyncio.to_thread(self._add_turn, turn))
        else:
            await self._awrite(self._add_turn(turn))

    def _add_turn(self, turn: Turn) -> Operation:
        return _bind(_ops.insert_turn, encode_turn(turn))

    def add_tool_call(self, call: ToolCall) -> int:
        """A tool call of a rollout not yet trained; returns its sequence number in the rollout."""
        return self._write(self._add_tool_call(call))

    async def aadd_tool_call(self, call: ToolCall) -> int:
        return await self._awrite(self._add_tool_call(call))

    def _add_tool_call(self, call: ToolCall) -> Operation:
        return _bind(_ops.insert_tool_call, encode_tool_call(call))

    async def aadd_model_call(self, call: ModelCall) -> int:
        """A non-policy model call of a rollout not yet trained; returns its sequence number in the rollout."""
        return await self._awrite(_bind(insert_model_call, encode_model_call(call)))

    def _store_reward(self, row: RewardRow) -> bool:
        return self._write(_bind(_ops.set_reward, *row))

    async def _astore_reward(self, row: RewardRow) -> bool:
        return await self._awrite(_bind(_ops.set_reward, *row))

    def finish_rollout(self, rollout_id: str, status: RolloutStatus | str, error: str | None = None) -> bool:
        """Give a running rollout its final status; returns False (nothing changed) if it had one."""
        return self._write(self._finish_rollout(rollout_id, status, error))

    async def afinish_rollout(self, rollout_id: str, status: RolloutStatus | str, error: str | None = None) -> bool:
        return await self._awrite(self._finish_rollout(rollout_id, status, error))

    def _finish_rollout(self, rollout_id: str, status: Any, error: str | None) -> Operation:
        check_str("rollout_id", rollout_id)
        final = final_status("status", status)
        check_str("error", error, optional=True, empty=True)
        return _bind(_ops.finish_rollout, rollout_id, final.value, error, time.time())

    def mark_trained(self, rollout_ids: Sequence[str], step: int) -> None:
        """Record that update ``step`` consumed these rollouts: all or nothing, and never twice."""
        ids = check_rollout_ids("rollout_ids", rollout_ids)
        self._write(_bind(_ops.mark_trained, ids, check_int("step", step)))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append training metrics of ``step`` to the history."""
        check_int("step", step)
        now = time.time()
        rows = [(step, name, value, now) for name, value in check_metrics("metrics", metrics).items()]
        self._write(_bind(_ops.log_metrics, rows))

    def set_meta(self, key: str, value: Any) -> None:
        """Store a JSON value under ``key`` (checkpoint data: step counter, data position...)."""
        check_str("key", key)
        if key in _RESERVED_META:
            raise ValueError(f"key {key!r} is reserved by the store")
        self._write(_bind(_ops.set_meta, key, dumps(f"meta[{key!r}]", value)))

    def flush(self) -> None:
        """Block until every write queued so far is committed."""
        self._write(lambda conn: None)

    # ---- reads ----------------------------------------------------------

    def get_task(self, task_id: str) -> Task | None:
        return _reads.task(self._reader(), task_id)

    def get_rollout(self, rollout_id: str, with_turns: bool = True) -> Rollout | None:
        """The rollout, with its turns and tool calls unless ``with_turns`` is False."""
        with _reads.snapshot(self._reader()) as conn:
            return _reads.rollout(conn, rollout_id, with_turns)

    def _select_rollouts(
        self, step: int | None, status: RolloutStatus | None, group_id: str | None, untrained_only: bool,
        with_turns: bool,
    ) -> list[Rollout]:
        with _reads.snapshot(self._reader()) as conn:
            return _reads.rollouts(
                conn, step=step, status=None if status is None else status.value, group_id=group_id,
                untrained_only=untrained_only, with_turns=with_turns,
            )

    def count_turns(self, rollout_id: str) -> int:
        return _reads.count_turns(self._reader(), rollout_id)

    def count_tool_calls(self, rollout_id: str) -> int:
        return _reads.count_tool_calls(self._reader(), rollout_id)

    def token_hash(self, rollout_id: str) -> str | None:
        """The sha256 of the rollout's bearer token, or None for an unknown rollout."""
        return _reads.token_hash(self._reader(), rollout_id)

    def trained_step(self, rollout_id: str) -> int | None:
        """The update step that consumed the rollout, or None if not trained yet."""
        return _reads.trained_step(self._reader(), rollout_id)

    def metric_history(self, name: str | None = None) -> list[tuple[int, str, float]]:
        """``(step, name, value)`` in step order, of one metric or of all."""
        return _reads.metric_history(self._reader(), name)

    def get_meta(self, key: str, default: Any = None) -> Any:
        return _reads.get_meta(self._reader(), key, default)

    def export_jsonl(self, path: str | Path, step: int | None = None) -> int:
        """One JSON line per rollout (format in ``mtrl_runtime.store._export``); returns the count.

        Reads one consistent snapshot, holding one rollout in memory at a time.
        """
        with _reads.snapshot(self._reader()) as conn:
            return write_jsonl(path, _export_records(conn, step))

    # ---- lifecycle -------------------------------------------------------

    def close(self) -> None:
        """Commit every queued write, stop the writer and close every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        with self._readers_lock:
            for _, conn in self._readers.values():
                conn.close()
            self._readers.clear()

    def __enter__(self) -> "SQLiteStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, op: Operation) -> Any:
        """Commit ``op`` and return its result (blocks until committed)."""
        return self._writer.submit(op).result()

    async def _awrite(self, op: Operation) -> Any:
        """Commit ``op`` with the other writes of this loop iteration; cancelling the awaiter keeps the write."""
        if self._closed:
            raise RuntimeError("the trajectory store is closed")
        if self.read_only:  # refused here: a batched write would fail on the loop, far from its caller
            return self._writer.submit(op)
        return await self._batch.submit(op)

    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection, opened on first use."""
        if self._closed:
            raise RuntimeError("the trajectory store is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect_reader(self.path, read_only=self.read_only)
            with self._readers_lock:
                for ident in [i for i, (thread, _) in self._readers.items() if not _alive(thread)]:
                    self._readers.pop(ident)[1].close()  # the thread is gone; so is its need
                self._readers[threading.get_ident()] = (weakref.ref(threading.current_thread()), conn)
            self._local.conn = conn
        return conn


def _export_records(conn: sqlite3.Connection, step: int | None) -> Iterator[dict[str, Any]]:
    """The export record of every rollout (of ``step``, if given), read one at a time."""
    for rollout_id in _reads.rollout_ids(conn, step):
        rollout = _reads.rollout(conn, rollout_id, with_turns=True)
        yield rollout_record(rollout, _reads.task(conn, rollout.task_id), _reads.trained_step(conn, rollout_id))


class _RefusedWrites:
    """The writer of a read-only store: every write is refused, naming the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def submit(self, op: Operation) -> Any:
        raise PermissionError(f"trajectory store {str(self.path)!r} is open read-only; nothing may be written")

    def submit_many(self, ops: list[Operation]) -> Any:
        return self.submit(lambda conn: None)

    def close(self) -> None:
        pass


def _alive(thread_ref: weakref.ref) -> bool:
    thread = thread_ref()
    return thread is not None and thread.is_alive()


def _bind(op: Any, *args: Any) -> Operation:
    """``op(conn, *args)`` as an operation of the write connection."""
    return lambda conn: op(conn, *args)
