"""The store's one writer thread: it group-commits queued write operations.

Callers submit an operation (a function of the write connection) and get a
``concurrent.futures.Future``. The thread takes everything queued, runs it
in one transaction (each operation inside its own savepoint, so one
operation's error undoes only that operation), commits, and only then
resolves the futures: a resolved future means the write is durable.
While one batch commits the next one queues, so the commit cost is shared
by every write that arrived meanwhile.

A submitter that finds the connection idle and nothing queued commits its
operations itself, on its own thread: on the endpoint's hot path a hand-off
to the writer thread costs more (two GIL switches) than the commit. Async
writes arrive in batches, one per event-loop iteration (``_loop_batch``).
Order is kept where it matters: a write that depends on another is only
submitted after that one's future resolved, i.e. after it committed.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from concurrent.futures import Future
from typing import Any, Callable

Operation = Callable[[sqlite3.Connection], Any]

_STOP = object()
MAX_BATCH = 1024  # operations per transaction; bounds the latency one commit adds


class Writer:
    """Owns the write connection; ``submit`` is safe from any thread."""

    def __init__(self, conn: sqlite3.Connection, name: str = "mtrl-store-writer") -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._conn_lock = threading.Lock()  # held while a transaction runs, by any thread
        self._closed = False
        # A daemon thread so a store that is never closed does not hang interpreter exit;
        # what it had committed is safe, what was still queued was never acknowledged.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, op: Operation) -> Future:
        """Queue ``op``; the future resolves to its result once committed (or to its error)."""
        return self.submit_many([op])[0]

    def submit_many(self, ops: list[Operation]) -> list[Future]:
        """Queue ``ops``, in order; committed in one transaction when the connection is idle."""
        items = [(op, Future()) for op in ops]
        with self._lock:
            if self._closed:
                raise RuntimeError("the trajectory store is closed")
            inline = self._queue.empty() and self._conn_lock.acquire(blocking=False)
            if not inline:
                for item in items:
                    self._queue.put(item)
        if inline:
            try:
                self._commit(items)
            finally:
                self._conn_lock.release()
        return [future for _, future in items]

    def close(self) -> None:
        """Commit everything queued, stop the thread and close the connection."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()
        with self._conn_lock:  # an inline commit may still be running
            self._conn.close()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            ops = [item for item in batch if item is not _STOP]
            if ops:
                with self._conn_lock:
                    self._commit(ops)
            if len(ops) != len(batch):  # _STOP is always the last item ever queued
                return

    def _commit(self, ops: list[tuple[Operation, Future]]) -> None:
        if len(ops) == 1:
            self._commit_one(*ops[0])
            return
        outcomes: list[tuple[Future, BaseException | None, Any]] = []
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            for op, future in ops:
                outcomes.append((future, *self._apply(op)))
            self._conn.execute("COMMIT")
        except Exception as exc:  # BEGIN or COMMIT failed (disk full, locked by another process)
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            for _, future in ops:
                future.set_exception(exc)
            return
        for future, error, result in outcomes:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def _commit_one(self, op: Operation, future: Future) -> None:
        """One operation needs no savepoint: its error rolls back the whole transaction."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            result = op(self._conn)
            self._conn.execute("COMMIT")
        except Exception as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            future.set_exception(exc)
            return
        future.set_result(result)

    def _apply(self, op: Operation) -> tuple[BaseException | None, Any]:
        self._conn.execute("SAVEPOINT op")
        try:
            result = op(self._conn)
        except Exception as exc:
            self._conn.execute("ROLLBACK TO op")
            self._conn.execute("RELEASE op")
            return exc, None
        self._conn.execute("RELEASE op")
        return None, result


__all__ = ["MAX_BATCH", "Operation", "Writer"]
