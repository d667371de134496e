"""Columnar files, read with pyarrow: parquet (SageMaker AI MTRL's ``prompts.parquet``) and Arrow IPC.

``to_pylist`` gives plain Python values: a struct column becomes a dict, a
list column a list, a timestamp a datetime (made ISO text later). A struct
has every field any of its rows has, so a row's missing keys read as null.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._problems import DatasetError
from ._raw import RawRow, RawRows, need


def _rows(table: Any) -> RawRows:
    return RawRows([RawRow(row) for row in table.to_pylist()])


def read_parquet(path: Path) -> RawRows:
    """A parquet file (any writer: pandas, pyarrow, ``Dataset.to_parquet``, verl's preprocessing)."""
    source = repr(str(path))
    pq = need("pyarrow.parquet", source, "a .parquet file")
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
        raise DatasetError(source, f"cannot be read as parquet: {err}") from None
    return _rows(table)


def read_arrow(path: Path) -> RawRows:
    """An Arrow IPC file: the stream format ``datasets`` writes (its ``.arrow`` shards and cache files), or
    the random-access file format (``pyarrow.ipc.new_file``, Feather v2)."""
    source = repr(str(path))
    pa = need("pyarrow", source, "an .arrow file")
    errors = []
    for open_reader in (pa.ipc.open_stream, pa.ipc.open_file):
        try:
            with pa.memory_map(str(path)) as mapped:
                return _rows(open_reader(mapped).read_all())
        except (OSError, ValueError) as err:
            errors.append(str(err))
    raise DatasetError(source, f"cannot be read as Arrow IPC (stream: {errors[0]}; file: {errors[1]})")


__all__ = ["read_arrow", "read_parquet"]
