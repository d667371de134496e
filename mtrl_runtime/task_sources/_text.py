"""Text formats, read with the standard library: JSON Lines, JSON, CSV."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ._problems import DatasetError
from ._raw import RawRow, RawRows


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DatasetError(repr(str(path)), f"is not UTF-8 text ({err})") from None


def _json_lines(text: str) -> list[RawRow]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(RawRow(json.loads(line), f"line {number}"))
        except json.JSONDecodeError as err:
            rows.append(RawRow(None, f"line {number}", f"line {number} is not JSON: {err}"))
    return rows


def read_jsonl(path: Path) -> RawRows:
    """One JSON object per line; blank lines are skipped."""
    return RawRows(_json_lines(_read_text(path)))


def read_json(path: Path) -> RawRows:
    """A JSON array of row objects (SageMaker AI MTRL's ``.json``), or JSON lines (what ``Dataset.to_json`` writes)."""
    text = _read_text(path)
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return RawRows(_json_lines(text))
    if isinstance(whole, list):
        return RawRows([RawRow(value) for value in whole])
    return RawRows([RawRow(whole, "line 1")])


def read_csv(path: Path) -> RawRows:
    """A header row, then one row per task. Every cell is text, kept as written (no type guessing: ``007``
    stays ``"007"``); a row with more or fewer cells than the header is a bad row."""
    text = _read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""))  # newline="": a quoted cell may span lines
    header = next(reader, None)
    if not header:
        raise DatasetError(repr(str(path)), "a CSV file needs a header row naming its columns")
    unnamed = [i for i, name in enumerate(header) if not name.strip()]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if unnamed:
        raise DatasetError(repr(str(path)), f"header row: the columns at positions {unnamed} have no name")
    if repeated:
        raise DatasetError(repr(str(path)), f"header row: the columns {repeated} appear more than once")
    rows = []
    for cells in reader:
        where = f"line {reader.line_num}"
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) != len(header):
            rows.append(RawRow(None, where, f"{len(cells)} cells where the header names {len(header)} columns"))
            continue
        rows.append(RawRow(dict(zip(header, cells)), where))
    return RawRows(rows)


__all__ = ["read_csv", "read_json", "read_jsonl"]
