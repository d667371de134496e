"""The store's tables, its schema version, and opening a database (new or resumed).

Version 1 is ``_TABLES_V1``; each later version is a script in ``_MIGRATIONS``
(a new database is created at version 1 and migrated, so old and new files
end with the same tables). A turn's ``prompt_ids`` holds only the ids after ``prompt_prefix_len``; the
first ``prompt_prefix_len`` ids are those of the previous turn's prompt +
completion (sequence extension), so a rollout's prompts cost linear, not
quadratic, space. JSON columns hold compact JSON text; id and logprob
columns hold little-endian int32 / float64 bytes (see ``store._codec``).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

SCHEMA_VERSION = 6
BUSY_TIMEOUT_MS = 10_000

_TABLES_V1 = """
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL                      -- JSON
);
CREATE TABLE tasks (
    id           TEXT PRIMARY KEY,
    prompt       TEXT,
    messages     TEXT,                       -- JSON list or NULL
    ground_truth TEXT NOT NULL,              -- JSON
    split        TEXT NOT NULL,
    data         TEXT NOT NULL               -- JSON object
);
CREATE TABLE rollouts (
    id               TEXT PRIMARY KEY,
    task_id          TEXT NOT NULL REFERENCES tasks(id),
    group_id         TEXT NOT NULL,
    status           TEXT NOT NULL,
    reward           REAL,
    turn_rewards     TEXT,                   -- JSON list or NULL
    reward_defaulted INTEGER NOT NULL,
    metrics          TEXT NOT NULL,          -- JSON object
    error            TEXT,
    policy_version   INTEGER NOT NULL,
    step             INTEGER,
    token_hash       TEXT NOT NULL,          -- sha256 hex of the bearer token, never the token
    created_at       REAL NOT NULL,
    finished_at      REAL,
    trained_step     INTEGER                 -- the step that consumed it; NULL until trained
);
CREATE INDEX rollouts_by_step ON rollouts(step);
CREATE INDEX rollouts_by_group ON rollouts(group_id);
CREATE INDEX rollouts_by_status ON rollouts(status);
CREATE INDEX rollouts_by_trained ON rollouts(trained_step);
CREATE TABLE turns (
    rollout_id          TEXT NOT NULL REFERENCES rollouts(id),
    idx                 INTEGER NOT NULL,
    messages            TEXT NOT NULL,       -- JSON list
    tools               TEXT NOT NULL,       -- JSON list
    prompt_prefix_len   INTEGER NOT NULL,    -- leading ids taken from the previous turn
    prompt_ids          BLOB NOT NULL,       -- int32 LE, the ids after the prefix
    completion_ids      BLOB NOT NULL,       -- int32 LE
    logprobs            BLOB NOT NULL,       -- float64 LE, one per completion id
    finish_reason       TEXT NOT NULL,
    completion_text     TEXT NOT NULL,
    tool_calls          TEXT NOT NULL,       -- JSON list (OpenAI format)
    policy_version      INTEGER NOT NULL,
    segment             INTEGER NOT NULL,
    break_reason        TEXT,
    malformed_tool_call INTEGER NOT NULL,
    started_at          REAL NOT NULL,
    latency_s           REAL NOT NULL,
    PRIMARY KEY (rollout_id, idx)
);
CREATE TABLE tool_calls (
    rollout_id TEXT NOT NULL REFERENCES rollouts(id),
    seq        INTEGER NOT NULL,             -- order of arrival within the rollout
    call_id    TEXT,
    name       TEXT NOT NULL,
    arguments  TEXT NOT NULL,                -- JSON
    result     TEXT NOT NULL,                -- JSON
    error      TEXT,
    status     TEXT NOT NULL,
    latency_s  REAL NOT NULL,
    turn_index INTEGER,
    started_at REAL NOT NULL,
    PRIMARY KEY (rollout_id, seq)
);
CREATE TABLE metrics (
    step      INTEGER NOT NULL,
    name      TEXT NOT NULL,
    value     REAL NOT NULL,
    wall_time REAL NOT NULL
);
CREATE INDEX metrics_by_name ON metrics(name, step);
"""

# version -> script that brings a database from version - 1 to version.
_MIGRATIONS: dict[int, str] = {
    # 2: each turn's reasoning (``reasoning_content``) and its token count. A version-1 turn has none recorded
    # apart: NULL and 0, while its completion_text (and completion_ids) still hold whatever the model wrote.
    2: """
ALTER TABLE turns ADD COLUMN reasoning TEXT;                            -- NULL: none, or a version-1 turn
ALTER TABLE turns ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0;
-- and each rollout's non-policy model calls (a judge, a planner: passed through, never trained); none in version 1
CREATE TABLE model_calls (
    rollout_id    TEXT NOT NULL REFERENCES rollouts(id),
    seq           INTEGER NOT NULL,          -- order of arrival within the rollout
    protocol      TEXT NOT NULL,             -- openai | anthropic | bedrock
    model         TEXT,
    latency_s     REAL NOT NULL,
    started_at    REAL NOT NULL,
    input_tokens  INTEGER,                   -- NULL: the response did not say
    output_tokens INTEGER,
    stream        INTEGER NOT NULL,
    status        TEXT NOT NULL,
    error         TEXT,
    PRIMARY KEY (rollout_id, seq)
);
""",
    # 3: the model that wrote a turn when it was not the policy (an evaluation's reference model, passed through
    # to its own endpoint): such a turn has no token ids and is never trained on. Earlier turns are the policy's.
    3: """
ALTER TABLE turns ADD COLUMN model TEXT;                                -- NULL: the policy's turn
""",
    # 4: where each tool call ran: "mcp:<server>" for a tool an MCP server served; NULL for the agent's own tool
    # (every call of an earlier version was recorded without it: NULL)
    4: """
ALTER TABLE tool_calls ADD COLUMN source TEXT;                          -- NULL: a local tool, or unrecorded
""",
    # 5: the policy version behind each completion id of a turn generated across a weight update (a partial
    # rollout, advanced.async_config.partial_rollouts). Every earlier turn ran under one version: NULL
    5: """
ALTER TABLE turns ADD COLUMN token_versions BLOB;                       -- uint32 LE per completion id; NULL: all policy_version
""",
    # 6: the role whose model id a turn's call named (``advanced.policy_models`` as a mapping: ``roles``); every
    # earlier turn was the one policy's: NULL
    6: """
ALTER TABLE turns ADD COLUMN role TEXT;                                 -- NULL: the one policy's turn
""",
}


def connect(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, synchronous=NORMAL.

    In WAL mode with synchronous=NORMAL a committed transaction is in the WAL
    file when COMMIT returns, so it survives the process being killed; only
    an OS crash or power loss can lose the last commits.
    """
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def connect_reader(path: Path, read_only: bool = False) -> sqlite3.Connection:
    """A read-only connection (``query_only``) in autocommit mode; WAL lets it read while the writer writes.

    ``read_only``: opened with ``mode=ro``, so the file must exist and nothing
    is written to it (not even the WAL checkpoint a last connection does).
    """
    target, uri = (f"{path.resolve().as_uri()}?mode=ro", True) if read_only else (str(path), False)
    conn = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False,
                           timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute("PRAGMA query_only=ON")
    return conn


def read_version(path: Path) -> int:
    """The schema version of an existing store, read without writing; a file that needs a migration is refused."""
    if not path.is_file():
        raise FileNotFoundError(f"no trajectory store at {str(path)!r}")
    conn = connect_reader(path, read_only=True)
    try:
        version = _version(conn)
    finally:
        conn.close()
    if version != SCHEMA_VERSION:
        raise RuntimeError(
            f"trajectory store {str(path)!r} has schema_version {version}; read-only opening needs "
            f"{SCHEMA_VERSION}: open it once read-write (SQLiteStore(path)) to migrate it"
        )
    return version


def prepare(conn: sqlite3.Connection) -> int:
    """Create the tables in a new database, or check and migrate an existing one; returns its version."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _version(conn)
        if version is None:  # a new file; executescript would commit, so run statements one by one
            for statement in _statements(_TABLES_V1):
                conn.execute(statement)
            version = 1
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"trajectory store schema_version {version} is newer than this mtrl supports "
                f"({SCHEMA_VERSION}); upgrade mtrl to open it"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _statements(_MIGRATIONS[target]):
                conn.execute(statement)
        conn.execute(
            "INSERT INTO meta(key, value) VALUES('schema_version', ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (json.dumps(SCHEMA_VERSION),),
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION


def _version(conn: sqlite3.Connection) -> int | None:
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
    if not has_meta:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'").fetchone():
            raise RuntimeError("this SQLite file holds tables but no mtrl meta table; not a trajectory store")
        return None
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise RuntimeError("trajectory store has no schema_version in its meta table")
    return int(json.loads(row[0]))


def _statements(script: str) -> list[str]:
    """Split a script into statements (``;`` inside comments and strings is not a separator)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip():
        raise ValueError(f"incomplete SQL statement in schema script: {current.strip()[:80]!r}")
    return statements
