"""The ``memory`` store backend: a ``TrajectoryStore`` in plain dicts, for tests (``MemoryStore``)."""

from ._store import MemoryStore

__all__ = ["MemoryStore"]
