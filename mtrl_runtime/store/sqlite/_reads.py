"""Read queries, run on a reader connection (one per thread; WAL lets them run beside the writer)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

from ...types import Rollout, Task, ToolCall, Turn
from .._codec import (
    ROLLOUT_COLUMNS,
    TOOL_CALL_COLUMNS,
    TurnRow,
    decode_rollout,
    decode_task,
    decode_tool_call,
    decode_turn,
    empty_ids,
    ids_from_blob,
)
from ._model_calls import model_calls

TURN_COLUMNS = (
    "rollout_id, idx, messages, tools, prompt_prefix_len, prompt_ids, completion_ids, logprobs, "
    "finish_reason, completion_text, tool_calls, policy_version, segment, break_reason, "
    "malformed_tool_call, started_at, latency_s, reasoning, reasoning_tokens, model, token_versions, role"
)


@contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One read transaction, so queries that belong together see the same committed state."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("COMMIT")


def task(conn: sqlite3.Connection, task_id: str) -> Task | None:
    row = conn.execute(
        "SELECT id, prompt, messages, ground_truth, split, data FROM tasks WHERE id = ?", (task_id,)
    ).fetchone()
    return None if row is None else decode_task(row)


def rollout(conn: sqlite3.Connection, rollout_id: str, with_turns: bool) -> Rollout | None:
    row = conn.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
    if row is None:
        return None
    if not with_turns:
        return decode_rollout(row)
    return _with_model_calls(conn, decode_rollout(row, turns(conn, rollout_id), tool_calls(conn, rollout_id)))


def rollouts(
    conn: sqlite3.Connection,
    *,
    step: int | None,
    status: str | None,
    group_id: str | None,
    untrained_only: bool,
    with_turns: bool,
) -> list[Rollout]:
    """Rollouts matching every filter given, in the order they were created."""
    where, params = _filters(step=step, status=status, group_id=group_id, untrained_only=untrained_only)
    rows = conn.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY rowid", params).fetchall()
    if not with_turns:
        return [decode_rollout(row) for row in rows]
    return [_with_model_calls(conn, decode_rollout(row, turns(conn, row[0]), tool_calls(conn, row[0]))) for row in rows]


def rollout_ids(conn: sqlite3.Connection, step: int | None) -> list[str]:
    where, params = _filters(step=step)
    return [rollout_id for (rollout_id,) in conn.execute(f"SELECT id FROM rollouts{where} ORDER BY rowid", params)]


def turns(conn: sqlite3.Connection, rollout_id: str) -> tuple[Turn, ...]:
    """A rollout's turns by index, each prompt rebuilt from the previous turn's ids + its own suffix."""
    out: list[Turn] = []
    context = empty_ids()  # the previous turn's prompt + completion ids
    for row in conn.execute(f"SELECT {TURN_COLUMNS} FROM turns WHERE rollout_id = ? ORDER BY idx", (rollout_id,)):
        prefix_len, suffix, completion = row[4], row[5], row[6]
        if prefix_len and (not out or out[-1].index != row[1] - 1 or len(context) < prefix_len):
            raise RuntimeError(f"turn {row[1]} of rollout {rollout_id!r} shares a prefix with a missing turn")
        prompt = context[:prefix_len]
        prompt.extend(ids_from_blob(suffix))
        out.append(decode_turn(TurnRow(*row[:4], prompt, *row[6:])))  # columns 4-5 (prefix, suffix) as one prompt
        context = prompt
        context.extend(ids_from_blob(completion))
    return tuple(out)


def tool_calls(conn: sqlite3.Connection, rollout_id: str) -> tuple[ToolCall, ...]:
    rows = conn.execute(
        f"SELECT {TOOL_CALL_COLUMNS} FROM tool_calls WHERE rollout_id = ? ORDER BY seq", (rollout_id,)
    )
    return tuple(decode_tool_call(row) for row in rows)


def _with_model_calls(conn: sqlite3.Connection, rollout: Rollout) -> Rollout:
    calls = model_calls(conn, rollout.id)
    return replace(rollout, model_calls=calls) if calls else rollout


def count_turns(conn: sqlite3.Connection, rollout_id: str) -> int:
    return conn.execute("SELECT COUNT(*) FROM turns WHERE rollout_id = ?", (rollout_id,)).fetchone()[0]


def count_tool_calls(conn: sqlite3.Connection, rollout_id: str) -> int:
    return conn.execute("SELECT COUNT(*) FROM tool_calls WHERE rollout_id = ?", (rollout_id,)).fetchone()[0]


def token_hash(conn: sqlite3.Connection, rollout_id: str) -> str | None:
    row = conn.execute("SELECT token_hash FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
    return None if row is None else row[0]


def trained_step(conn: sqlite3.Connection, rollout_id: str) -> int | None:
    row = conn.execute("SELECT trained_step FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
    if row is None:
        raise ValueError(f"rollout_id: unknown rollout id {rollout_id!r}")
    return row[0]


def metric_history(conn: sqlite3.Connection, name: str | None) -> list[tuple[int, str, float]]:
    if name is None:
        rows = conn.execute("SELECT step, name, value FROM metrics ORDER BY step, rowid")
    else:
        rows = conn.execute("SELECT step, name, value FROM metrics WHERE name = ? ORDER BY step, rowid", (name,))
    return [tuple(row) for row in rows]


def get_meta(conn: sqlite3.Connection, key: str, default: Any) -> Any:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return default if row is None else json.loads(row[0])


def _filters(**given: Any) -> tuple[str, tuple]:
    """A WHERE clause from fixed column filters (never from user-supplied names)."""
    clauses, params = [], []
    for column in ("step", "status", "group_id"):
        if given.get(column) is not None:
            clauses.append(f"{column} = ?")
            params.append(given[column])
    if given.get("untrained_only"):
        clauses.append("trained_step IS NULL")
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)
