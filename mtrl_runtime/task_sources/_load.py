"""A dataset source to Tasks: read its rows, map each, report every bad row, keep the split asked for."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..types import Task
from ._formats import read_source
from ._hf import in_memory_rows
from ._problems import DatasetError, RowProblem
from ._raw import RawRow, RawRows
from ._rows import convert_row
from ._spec import parse_source



def _raw(source: Any) -> tuple[RawRows, str, str | None]:
    """The rows of ``source``, how errors name it, and the split asked for."""
    if isinstance(source, (str, Path)):
        spec = parse_source(source)
        return read_source(spec), repr(str(source)), spec.split
    rows = in_memory_rows(source)
    if rows is not None:
        return rows, f"(a {type(source).__name__})", None
    if isinstance(source, Mapping) or not isinstance(source, Iterable):
        raise DatasetError(f"({type(source).__name__})", "expected a path (PATH or PATH::SPLIT), Tasks or row "
                                                         "objects, a datasets.Dataset or a pandas DataFrame")
    return RawRows([RawRow(row) for row in source]), "(rows)", None


def read_tasks(source: Any) -> list[Task]:
    """Tasks from a path (``PATH`` or ``PATH::SPLIT``: .jsonl, .json, .csv, .parquet, .arrow, a save_to_disk
    folder), a ``datasets.Dataset`` / ``DatasetDict`` / pandas DataFrame, or Tasks / row objects.

    Every bad row is reported in one DatasetError (index, field, what is wrong; the first
    ``MAX_LISTED``), ids must be unique, and a split asked for must hold tasks.
    """
    raw, name, split = _raw(source)
    tasks: list[Task] = []
    problems: list[RowProblem] = []
    first_row: dict[str, int] = {}
    for index, row in enumerate(raw.rows):
        if row.unreadable is not None:
            problems.append(RowProblem(index, None, row.unreadable))
            continue
        if isinstance(row.value, Task):
            task = row.value
        else:
            task, bad = convert_row(row.value, index, row.where, raw.default_split)
            problems += bad
            if task is None:
                continue
        if task.id in first_row:
            problems.append(RowProblem(index, "id", f"task id {task.id!r} appears more than once "
                                                    f"(first at row {first_row[task.id]})", row.where))
        else:
            first_row[task.id] = index
        tasks.append(task)
    if problems:
        raise DatasetError(name, problems=problems, rows=len(raw.rows))
    if split is not None and not raw.split_chosen:
        present = sorted({t.split for t in tasks})
        tasks = [t for t in tasks if t.split == split]
        if not tasks:
            raise DatasetError(name, f"no task has split {split!r}; the splits present: {present}")
    if not tasks:
        raise DatasetError(name, "holds no tasks")
    return tasks


__all__ = ["read_tasks"]
