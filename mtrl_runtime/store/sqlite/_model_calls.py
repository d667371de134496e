"""The ``model_calls`` table (schema version 2): a rollout's non-policy model calls, in order of arrival."""

from __future__ import annotations

import sqlite3

from ...types import ModelCall
from .._checks import check_untrained
from .._model_calls import COLUMNS, decode_model_call


def insert_model_call(conn: sqlite3.Connection, row: tuple) -> int:
    """Store one encoded call (see ``store._model_calls``); refused once the rollout was trained."""
    state = conn.execute("SELECT trained_step FROM rollouts WHERE id = ?", (row[0],)).fetchone()
    if state is None:
        raise ValueError(f"model_call.rollout_id: unknown rollout id {row[0]!r}")
    check_untrained(row[0], state[0], "model calls")
    (seq,) = conn.execute(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM model_calls WHERE rollout_id = ?", (row[0],)
    ).fetchone()
    values = (row[0], seq, *row[1:])
    conn.execute(f"INSERT INTO model_calls({COLUMNS}) VALUES({', '.join('?' * len(values))})", values)
    return seq


def model_calls(conn: sqlite3.Connection, rollout_id: str) -> tuple[ModelCall, ...]:
    rows = conn.execute(f"SELECT {COLUMNS} FROM model_calls WHERE rollout_id = ? ORDER BY seq", (rollout_id,))
    return tuple(decode_model_call(row) for row in rows)


__all__ = ["insert_model_call", "model_calls"]
