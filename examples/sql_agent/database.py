"""The company database: the committed schema and rows, as one fresh in-memory SQLite copy per use.

``company_env()`` is what the agent's episodes open (``env.open()`` gives
a rollout its own database with a read-only ``query_database`` tool);
``grading_env()`` is the same data with a higher row limit, for the
reward, which runs the agent's final query and the gold query on a fresh
copy of their own.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping

from mtrl_runtime.envs import SqliteEnv

DB_DIR = Path(__file__).resolve().parent / "db"
AGENT_ROW_LIMIT = 20  # rows a query_database call returns: enough to read an answer, short for a small model
GRADING_ROW_LIMIT = 1000  # rows the reward compares; every gold answer is far smaller
QUERY_TIMEOUT_S = 1.0


@functools.lru_cache(maxsize=1)
def schema_sql() -> str:
    """The CREATE TABLE statements, as committed in db/schema.sql."""
    return (DB_DIR / "schema.sql").read_text(encoding="utf-8")


def load_rows(root: Path = DB_DIR) -> dict[str, list[dict[str, Any]]]:
    """The committed rows, table by table."""
    return json.loads((Path(root) / "rows.json").read_text(encoding="utf-8"))


def build_env(rows: Mapping[str, Any] | None = None, *, row_limit: int = AGENT_ROW_LIMIT) -> SqliteEnv:
    """A SqliteEnv over the schema and ``rows`` (default: the committed rows)."""
    return SqliteEnv(schema_sql(), rows if rows is not None else load_rows(),
                     row_limit=row_limit, timeout_s=QUERY_TIMEOUT_S)


@functools.lru_cache(maxsize=1)
def company_env() -> SqliteEnv:
    """The agent's environment, built on first use and shared: each ``open()`` is a fresh copy."""
    return build_env()


@functools.lru_cache(maxsize=1)
def grading_env() -> SqliteEnv:
    """The reward's environment (same data, higher row limit)."""
    return build_env(row_limit=GRADING_ROW_LIMIT)


__all__ = ["AGENT_ROW_LIMIT", "DB_DIR", "GRADING_ROW_LIMIT", "build_env", "company_env", "grading_env",
           "load_rows", "schema_sql"]
