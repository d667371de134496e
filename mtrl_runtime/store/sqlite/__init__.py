"""The ``sqlite`` store backend: one SQLite (WAL) file in the run folder, e.g. ``runs/x/trajectories.db``.

``_store`` is the ``SQLiteStore`` class; ``_schema`` the tables, ``_ops``
the writes and ``_reads`` the queries; ``_writer`` commits (inline when idle,
else from a group-committing thread) and ``_loop_batch`` gathers the async
writes of one event-loop iteration into one transaction. Validation and
the row codec are shared with the other backends (``store._codec``).
"""

from ._store import SQLiteStore

__all__ = ["SQLiteStore"]
