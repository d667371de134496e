"""Plain JSON values from what columnar readers hand out: numpy arrays and scalars, pyarrow scalars and arrays.

pandas gives a list column as a numpy array and an int as ``numpy.int64``;
a ``datasets.Dataset`` in numpy format does the same; pyarrow gives structs
as ``StructScalar``. A Task holds JSON values only (it is stored, sent to
agent servers and compared), so each becomes its plain form: arrays lists,
scalars Python numbers, structs dicts, dates and times ISO 8601 strings,
NaN and pandas' NA / NaT null (pandas' missing values; JSON has no NaN).
A value with no JSON form (bytes, Decimal, a set, an object) is an error
naming the field, never dropped or turned into text silently. numpy and
pyarrow are looked up only if already imported: whoever made such a value
imported them, and a JSONL user's load imports neither.
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
from collections.abc import Mapping
from typing import Any

JSON_SCALARS = (str, bool, int, float, type(None))


class NotJSON(ValueError):
    """A value with no JSON form; ``field`` is its path in the row (``extra_info.tools[0]``)."""

    def __init__(self, field: str, value: Any) -> None:
        self.field = field
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        super().__init__(f"a {type(value).__module__}.{type(value).__qualname__} ({shown}) has no JSON form; "
                         "cast the column to a string or number before loading")


class _NotPlain(Exception):
    """A value the fast path does not take: the full walk handles it (and names its field)."""


def _fast(value: Any) -> Any:
    """Dicts, lists and scalars as they are (a copy); _NotPlain at anything else. Exact types only: most rows
    (JSON lines, pyarrow's ``to_pylist``) are plain already, and isinstance on typing's ABCs is slow."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return None if value != value else value  # NaN
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            out[key] = _fast(item)
        return out
    if kind is list:
        return [_fast(item) for item in value]
    raise _NotPlain


def plain_json(value: Any, field: str) -> Any:
    """``value`` as plain JSON (dict, list, str, int, float, bool, None); NotJSON naming ``field`` otherwise."""
    try:
        return _fast(value)
    except _NotPlain:
        return _walk(value, field)


def _walk(value: Any, field: str) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None  # pandas' missing value; JSON has no NaN (a store would write null too)
    if isinstance(value, JSON_SCALARS):
        return value
    pd = sys.modules.get("pandas")
    if pd is not None and (value is pd.NA or value is pd.NaT):
        return None
    pa = sys.modules.get("pyarrow")
    if pa is not None:  # before Mapping: a StructScalar is a Mapping of scalars
        if isinstance(value, pa.Scalar):
            return _walk(value.as_py(), field)
        if isinstance(value, (pa.Array, pa.ChunkedArray)):
            return _walk(value.to_pylist(), field)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJSON(f"{field}.{key!r}", key)
            out[key] = _walk(item, f"{field}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_walk(item, f"{field}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray):
            return _walk(value.tolist(), field)
        if isinstance(value, np.datetime64):  # .item() of a nanosecond one is a bare int
            return str(value)
        if isinstance(value, np.generic) and not isinstance(value, (np.bytes_, np.void)):
            return _walk(value.item(), field)
    raise NotJSON(field, value)


__all__ = ["NotJSON", "plain_json"]
