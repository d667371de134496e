"""Verifiable SQL environments: one private in-memory SQLite database per rollout.

``SqliteEnv(schema_sql, seed_rows)`` builds the schema and seed data once into
a template; ``env.open()`` copies it (SQLite's backup API) into a fresh
``:memory:`` database, so each rollout starts from the same state and never
sees another's writes. The agent's tool (``db.query_tool()``) is read-only
(an authorizer allows only reads), returns at most ``row_limit`` rows, and
is interrupted after ``timeout_s`` by a progress handler. A reward compares
the agent's answer with a gold query through ``result_sets_equal``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from ._tooling import JSON, as_function, tool_spec

# What the agent's read-only query may do; anything else (writes, PRAGMA, ATTACH) is refused.
_READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE})
_PROGRESS_EVERY = 1000  # SQLite VM instructions between timeout checks (~tens of microseconds)
_MAX_VALUE_BYTES = 1_000_000  # longest string/blob a query may build: stops randomblob(1e9)-style memory bombs
_MAX_SQL_CHARS = 20_000


class SqliteEnv:
    """A schema plus seed rows, copied into a fresh in-memory database for each rollout."""

    def __init__(
        self,
        schema_sql: str,
        seed_rows: Mapping[str, Sequence[Mapping[str, JSON] | Sequence[JSON]]] | None = None,
        *,
        row_limit: int = 100,
        timeout_s: float = 1.0,
    ) -> None:
        if row_limit < 1:
            raise ValueError(f"row_limit must be >= 1, got {row_limit!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.row_limit = row_limit
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._template = _connect()
        try:
            self._template.executescript(schema_sql)
            for table, rows in (seed_rows or {}).items():
                _insert(self._template, table, rows)
            self._template.commit()
        except sqlite3.Error as exc:
            self._template.close()
            raise ValueError(f"SqliteEnv: schema or seed rows failed: {exc}") from None
        except BaseException:
            self._template.close()
            raise

    def open(self) -> "SqliteDatabase":
        """A fresh database for one rollout, holding the schema and seed rows."""
        conn = _connect()
        with self._lock:
            self._template.backup(conn)
        return SqliteDatabase(conn, row_limit=self.row_limit, timeout_s=self.timeout_s)

    def close(self) -> None:
        self._template.close()


class SqliteDatabase:
    """One rollout's database: the agent's read-only ``query`` and the environment's own access."""

    def __init__(self, conn: sqlite3.Connection, *, row_limit: int, timeout_s: float) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # tools may run in worker threads; one statement at a time
        self.row_limit = row_limit
        self.timeout_s = timeout_s

    def query(self, sql: str) -> dict[str, JSON]:
        """Run one read-only statement for the agent: columns, rows (<= row_limit), or an error result."""
        if not isinstance(sql, str) or not sql.strip():
            return {"error": "sql must be a non-empty SQL string"}
        if len(sql) > _MAX_SQL_CHARS:
            return {"error": f"sql is {len(sql)} characters; the limit is {_MAX_SQL_CHARS}"}
        try:
            with self._lock, self._limits(read_only=True, timeout_s=self.timeout_s):
                cursor = self._conn.execute(sql)
                rows = cursor.fetchmany(self.row_limit + 1)
                columns = [d[0] for d in cursor.description or ()]
        except sqlite3.Error as exc:
            return {"error": self._explain(exc)}
        truncated = len(rows) > self.row_limit
        rows = rows[: self.row_limit]
        return {"columns": columns, "rows": [list(r) for r in rows], "row_count": len(rows), "truncated": truncated}

    def fetch_all(self, sql: str, params: Sequence[Any] = (), *, timeout_s: float | None = None) -> list[tuple[Any, ...]]:
        """Every row of a query, for rewards and checks (no row limit; still interrupted on timeout)."""
        with self._lock, self._limits(read_only=False, timeout_s=timeout_s or self.timeout_s):
            return self._conn.execute(sql, params).fetchall()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """A write by the environment itself (a stateful tool); returns the number of rows changed."""
        with self._lock:
            cursor = self._conn.execute(sql, params)
            self._conn.commit()
            return cursor.rowcount

    def query_tool(self, name: str = "query_database", description: str | None = None) -> "SqlQueryTool":
        return SqlQueryTool(self, name, description)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "SqliteDatabase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _limits(self, *, read_only: bool, timeout_s: float) -> "_Limits":
        return _Limits(self._conn, read_only=read_only, timeout_s=timeout_s)

    def _explain(self, exc: sqlite3.Error) -> str:
        text = str(exc)
        if "not authorized" in text:
            return "only read-only queries (SELECT / WITH) are allowed"
        if "interrupted" in text:
            return f"query timed out after {self.timeout_s:g}s"
        return f"query failed: {text}"


class SqlQueryTool:
    """The agent-facing read-only query tool of one rollout's database."""

    def __init__(self, db: SqliteDatabase, name: str, description: str | None) -> None:
        self.db = db
        self.name = name
        self.description = description or (
            f"Run one read-only SQL query (SQLite dialect) and get its rows (at most {db.row_limit})."
        )
        self.parameters = {
            "type": "object",
            "properties": {"sql": {"type": "string", "description": "one SELECT (or WITH ... SELECT) statement"}},
            "required": ["sql"],
            "additionalProperties": False,
        }

    @property
    def spec(self) -> dict[str, JSON]:
        return tool_spec(self.name, self.description, self.parameters)

    def as_function(self, *, output: str = "json") -> Callable[..., Any]:
        return as_function(self, output=output)

    def __call__(self, sql: str = "", **unknown: JSON) -> dict[str, JSON]:
        if unknown:
            return {"error": f"unknown argument {', '.join(map(repr, sorted(unknown)))} for {self.name}; expected sql"}
        return self.db.query(sql)


class _Limits:
    """Installs the authorizer, timeout and size limits for one statement, and removes them after."""

    def __init__(self, conn: sqlite3.Connection, *, read_only: bool, timeout_s: float) -> None:
        self._conn = conn
        self._read_only = read_only
        self._deadline = 0.0
        self._timeout_s = timeout_s

    def __enter__(self) -> None:
        self._deadline = time.monotonic() + self._timeout_s
        self._conn.set_progress_handler(self._expired, _PROGRESS_EVERY)
        if self._read_only:
            self._conn.set_authorizer(_authorize_read)

    def __exit__(self, *exc: Any) -> None:
        self._conn.set_progress_handler(None, 0)
        if self._read_only:
            try:
                self._conn.set_authorizer(None)
            except TypeError:  # Python 3.10 cannot remove an authorizer; install an allow-all one
                self._conn.set_authorizer(lambda *args: sqlite3.SQLITE_OK)

    def _expired(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0  # non-zero interrupts the statement


def _authorize_read(action: int, *args: Any) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def _connect() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    if hasattr(conn, "setlimit"):  # Python >= 3.11
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
    return conn


def _insert(conn: sqlite3.Connection, table: str, rows: Sequence[Mapping[str, JSON] | Sequence[JSON]]) -> None:
    rows = list(rows)
    if not rows:
        return
    if isinstance(rows[0], Mapping):
        columns = list(rows[0])
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping) or list(row) != columns:
                raise ValueError(f"seed_rows[{table!r}][{i}]: expected the columns {columns}, got {row!r}")
        values = [tuple(r[c] for c in columns) for r in rows]  # type: ignore[index]
        names = "(" + ", ".join(_quote(c) for c in columns) + ")"
    else:
        values = [tuple(r) for r in rows]
        columns, names = list(values[0]), ""
    marks = ", ".join("?" for _ in columns)
    conn.executemany(f"INSERT INTO {_quote(table)} {names} VALUES ({marks})", values)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def result_sets_equal(a: Any, b: Any, *, ordered: bool = False, float_digits: int = 9) -> bool:
    """Whether two query results hold the same rows (column names ignored; duplicates counted).

    ``a`` and ``b`` are lists of rows or ``query`` results (``{"rows": ...}``);
    an error result equals nothing. Floats are compared rounded to
    ``float_digits`` and ints equal floats of the same value, so ``SUM`` over
    ints and ``AVG`` results compare sensibly.
    """
    rows_a, rows_b = _rows(a), _rows(b)
    if rows_a is None or rows_b is None:
        return False
    norm_a = [_norm_row(r, float_digits) for r in rows_a]
    norm_b = [_norm_row(r, float_digits) for r in rows_b]
    return norm_a == norm_b if ordered else Counter(norm_a) == Counter(norm_b)


def _rows(result: Any) -> list[Any] | None:
    if isinstance(result, Mapping):
        return None if "error" in result else list(result.get("rows", ()))
    return list(result)


def _norm_row(row: Any, digits: int) -> tuple[Any, ...]:
    values = row.values() if isinstance(row, Mapping) else row
    return tuple(_norm_value(v, digits) for v in values)


def _norm_value(value: Any, digits: int) -> Any:
    if isinstance(value, float):
        rounded = round(value, digits)
        return 0.0 if rounded == 0 else rounded  # -0.0 and 0.0 are one value
    if isinstance(value, list):
        return tuple(value)
    return value
