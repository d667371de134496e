"""Write operations, run by the writer thread inside a transaction.

Each takes the write connection and already-validated rows (see ``store._codec``),
checks what depends on recorded data (unknown ids, finality, duplicates) and
raises ValueError before changing anything; the writer's savepoint undoes
any partial change of a failed operation.
"""

from __future__ import annotations

import json
import sqlite3
from array import array
from typing import Any, Sequence

from .._checks import check_untrained
from .._codec import ROLLOUT_COLUMNS, TOOL_CALL_COLUMNS, TurnRow, empty_ids, ids_from_blob, to_blob

_FINAL = ("completed", "failed", "timed_out", "interrupted", "abandoned")


def upsert_tasks(conn: sqlite3.Connection, rows: Sequence[tuple]) -> None:
    conn.executemany(
        "INSERT INTO tasks(id, prompt, messages, ground_truth, split, data) VALUES(?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(id) DO UPDATE SET prompt = excluded.prompt, messages = excluded.messages, "
        "ground_truth = excluded.ground_truth, split = excluded.split, data = excluded.data",
        rows,
    )


def insert_rollout(conn: sqlite3.Connection, row: tuple, turns: Sequence[TurnRow], calls: Sequence[tuple]) -> None:
    rollout_id, task_id = row[0], row[1]
    if conn.execute("SELECT 1 FROM rollouts WHERE id = ?", (rollout_id,)).fetchone():
        raise ValueError(f"rollout.id {rollout_id!r} is already recorded")
    if not conn.execute("SELECT 1 FROM tasks WHERE id = ?", (task_id,)).fetchone():
        raise ValueError(f"rollout.task_id {task_id!r} is not a recorded task; put_task it first")
    conn.execute(f"INSERT INTO rollouts({ROLLOUT_COLUMNS}) VALUES({', '.join('?' * len(row))})", row)
    for turn in sorted(turns, key=lambda t: t.index):
        _insert_turn(conn, turn)
    for call in calls:
        _insert_tool_call(conn, call)


def insert_turn(conn: sqlite3.Connection, row: TurnRow) -> None:
    status, trained = _rollout_state(conn, "turn.rollout_id", row.rollout_id)
    if status in _FINAL:
        raise ValueError(f"rollout {row.rollout_id!r} is {status}; turn.index {row.index} cannot be added")
    _insert_turn(conn, row)


def insert_tool_call(conn: sqlite3.Connection, row: tuple) -> int:
    _, trained = _rollout_state(conn, "tool_call.rollout_id", row[0])
    check_untrained(row[0], trained, "tool calls")
    return _insert_tool_call(conn, row)


def set_reward(
    conn: sqlite3.Connection,
    rollout_id: str,
    reward: float | None,
    turn_rewards: str | None,
    metrics: str,
    defaulted: bool,
) -> bool:
    """Store a reported reward (the latest report wins), or a default one if none was reported."""
    _, trained = _rollout_state(conn, "rollout_id", rollout_id)
    check_untrained(rollout_id, trained, "reward")
    condition = " AND reward IS NULL AND turn_rewards IS NULL" if defaulted else ""
    cursor = conn.execute(
        "UPDATE rollouts SET reward = ?, turn_rewards = ?, metrics = ?, reward_defaulted = ? "
        f"WHERE id = ?{condition}",
        (reward, turn_rewards, metrics, int(defaulted), rollout_id),
    )
    return cursor.rowcount == 1


def finish_rollout(
    conn: sqlite3.Connection, rollout_id: str, status: str, error: str | None, finished_at: float
) -> bool:
    """Move a running rollout to a final status; a final status is never overwritten."""
    current, _ = _rollout_state(conn, "rollout_id", rollout_id)
    if current in _FINAL:
        return False
    conn.execute(
        "UPDATE rollouts SET status = ?, error = ?, finished_at = ? WHERE id = ?",
        (status, error, finished_at, rollout_id),
    )
    return True


def mark_trained(conn: sqlite3.Connection, rollout_ids: Sequence[str], step: int) -> None:
    """All or nothing: every rollout exists, is final and was never trained."""
    ids_json = json.dumps(list(rollout_ids))
    found = {
        rollout_id: (status, trained)
        for rollout_id, status, trained in conn.execute(
            "SELECT id, status, trained_step FROM rollouts WHERE id IN (SELECT value FROM json_each(?))",
            (ids_json,),
        )
    }
    missing = [rollout_id for rollout_id in rollout_ids if rollout_id not in found]
    if missing:
        raise ValueError(f"rollout_ids: unknown rollout ids {missing[:10]!r}")
    twice = {rollout_id: t for rollout_id, (_, t) in found.items() if t is not None}
    if twice:
        raise ValueError(f"rollout_ids: already trained (id: step) {dict(list(twice.items())[:10])!r}")
    running = [rollout_id for rollout_id, (s, _) in found.items() if s not in _FINAL]
    if running:
        raise ValueError(f"rollout_ids: still running, cannot be trained {running[:10]!r}")
    conn.execute(
        "UPDATE rollouts SET trained_step = ? WHERE id IN (SELECT value FROM json_each(?))", (step, ids_json)
    )


def log_metrics(conn: sqlite3.Connection, rows: Sequence[tuple[int, str, float, float]]) -> None:
    conn.executemany("INSERT INTO metrics(step, name, value, wall_time) VALUES(?, ?, ?, ?)", rows)


def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    conn.execute(
        "INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def _rollout_state(conn: sqlite3.Connection, field: str, rollout_id: str) -> tuple[str, Any]:
    row = conn.execute("SELECT status, trained_step FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
    if row is None:
        raise ValueError(f"{field}: unknown rollout id {rollout_id!r}")
    return row


def _insert_turn(conn: sqlite3.Connection, row: TurnRow) -> None:
    prefix_len = _shared_prefix(conn, row)
    try:
        _execute_insert_turn(conn, row, prefix_len)
    except sqlite3.IntegrityError as exc:
        if "UNIQUE" not in str(exc):
            raise
        raise ValueError(f"turn.index {row.index} of rollout {row.rollout_id!r} is already recorded") from None


def _execute_insert_turn(conn: sqlite3.Connection, row: TurnRow, prefix_len: int) -> None:
    conn.execute(
        "INSERT INTO turns(rollout_id, idx, messages, tools, prompt_prefix_len, prompt_ids, completion_ids, "
        "logprobs, finish_reason, completion_text, tool_calls, policy_version, segment, break_reason, "
        "malformed_tool_call, started_at, latency_s, reasoning, reasoning_tokens, model, token_versions, role) "
        "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            row.rollout_id, row.index, row.messages, row.tools, prefix_len, to_blob(row.prompt_ids[prefix_len:]),
            row.completion_ids, row.logprobs, row.finish_reason, row.completion_text, row.tool_calls,
            row.policy_version, row.segment, row.break_reason, row.malformed_tool_call, row.started_at,
            row.latency_s, row.reasoning, row.reasoning_tokens, row.model, row.token_versions, row.role,
        ),
    )


def _insert_tool_call(conn: sqlite3.Connection, row: tuple) -> int:
    (seq,) = conn.execute(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM tool_calls WHERE rollout_id = ?", (row[0],)
    ).fetchone()
    conn.execute(
        f"INSERT INTO tool_calls({TOOL_CALL_COLUMNS}) VALUES({', '.join('?' * (len(row) + 1))})",
        (row[0], seq, *row[1:]),
    )
    return seq


def _shared_prefix(conn: sqlite3.Connection, row: TurnRow) -> int:
    """How many leading prompt ids equal the previous turn's prompt + completion (0 if not all of them)."""
    if row.index == 0:
        return 0
    context = previous_context(conn, row.rollout_id, row.index)
    if context is None or len(context) > len(row.prompt_ids) or row.prompt_ids[: len(context)] != context:
        return 0
    return len(context)


def previous_context(conn: sqlite3.Connection, rollout_id: str, index: int) -> array | None:
    """Turn ``index - 1``'s full prompt + completion ids, rebuilt from its chain of shared prefixes."""
    chain: list[tuple[int, bytes, bytes]] = []  # (prefix_len, suffix, completion), newest first
    expected = index - 1
    for idx, prefix_len, suffix, completion in conn.execute(
        "SELECT idx, prompt_prefix_len, prompt_ids, completion_ids FROM turns "
        "WHERE rollout_id = ? AND idx < ? ORDER BY idx DESC",
        (rollout_id, index),
    ):
        if idx != expected:
            break
        chain.append((prefix_len, suffix, completion))
        if prefix_len == 0:
            break
        expected -= 1
    if not chain or chain[-1][0] != 0:
        return None
    context = empty_ids()
    for prefix_len, suffix, completion in reversed(chain):
        del context[prefix_len:]
        context.extend(ids_from_blob(suffix))
        context.extend(ids_from_blob(completion))
    return context
