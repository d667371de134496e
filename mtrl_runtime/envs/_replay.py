"""Read-only tools replayed from fixtures: same arguments, same answer, every episode.

A ``ReplayTool`` indexes rows (from CSV, JSON or Python) by the values of its
key fields. Calling it looks the arguments up; a miss or a bad argument is an
error *result* the model reads (``{"error": "no record for aircraft_id='X9'"}``),
never an exception, because a model's typo is part of the episode, not a crash.

Arguments are normalized before the lookup so that harmless variation still
hits: surrounding and repeated whitespace is collapsed, case is ignored unless
``case_sensitive=True``, and numbers match their text (``42``, ``42.0`` and
``"42"`` are one key).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ._tooling import JSON, as_function, tool_spec

# A decimal number without leading zeros: such text is compared as the number it spells.
_NUMBER = re.compile(r"[+-]?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


class ReplayTool:
    """A lookup tool over fixture rows keyed by ``key_fields``.

    ``many=False``: each key has one row and a call returns that row (a dict);
    duplicate keys are an error at load time. ``many=True``: a call returns
    ``{"results": [rows...]}`` in fixture order (e.g. all flights of a route).
    """

    def __init__(
        self,
        name: str,
        rows: Iterable[Mapping[str, JSON]],
        key_fields: Sequence[str],
        *,
        description: str = "",
        field_descriptions: Mapping[str, str] | None = None,
        many: bool = False,
        case_sensitive: bool = False,
    ) -> None:
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"name must be letters, digits, '_' or '-', got {name!r}")
        if isinstance(key_fields, str) or not key_fields:
            raise ValueError(f"key_fields must be a non-empty list of field names, got {key_fields!r}")
        self.name = name
        self.key_fields = tuple(key_fields)
        self.many = many
        self.case_sensitive = case_sensitive
        what = "every record" if many else "the record"
        self.description = description or f"Look up {what} for the given {', '.join(self.key_fields)}."
        rows = [dict(r) for r in rows]
        self._index = self._build_index(rows)
        self.parameters = _parameters(rows, self.key_fields, field_descriptions or {})

    @classmethod
    def from_rows(cls, name: str, rows: Iterable[Mapping[str, JSON]], key_fields: Sequence[str], **kw: Any) -> "ReplayTool":
        return cls(name, rows, key_fields, **kw)

    @classmethod
    def from_csv(cls, path: str | Path, name: str, key_fields: Sequence[str], **kw: Any) -> "ReplayTool":
        """Rows from a CSV file with a header line; every value is read as text."""
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        return cls(name, rows, key_fields, **kw)

    @classmethod
    def from_json(cls, path: str | Path, name: str, key_fields: Sequence[str], **kw: Any) -> "ReplayTool":
        """Rows from a JSON file holding a list of objects, or a JSONL file (one object a line)."""
        text = Path(path).read_text(encoding="utf-8")
        if str(path).endswith(".jsonl"):
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            rows = json.loads(text)
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{path}: expected a list of JSON objects, got {type(rows).__name__}")
        return cls(name, rows, key_fields, **kw)

    @property
    def spec(self) -> dict[str, JSON]:
        return tool_spec(self.name, self.description, self.parameters)

    def as_function(self, *, output: str = "json") -> Callable[..., Any]:
        """A plain keyword function (for Strands ``@tool`` or LangChain ``StructuredTool``)."""
        return as_function(self, output=output)

    def __call__(self, **arguments: JSON) -> JSON:
        missing = [f for f in self.key_fields if _blank(arguments.get(f))]
        if missing:
            return {"error": f"missing argument {', '.join(map(repr, missing))} for {self.name}"}
        unknown = sorted(set(arguments) - set(self.key_fields))
        if unknown:
            return {"error": f"unknown argument {', '.join(map(repr, unknown))} for {self.name}; "
                             f"expected {', '.join(self.key_fields)}"}
        rows = self._index.get(self._key(arguments))
        if rows is None:
            shown = ", ".join(f"{f}={_shown(arguments[f])!r}" for f in self.key_fields)
            return {"error": f"no record for {shown}"}
        return {"results": [dict(r) for r in rows]} if self.many else dict(rows[0])

    def _key(self, values: Mapping[str, JSON]) -> tuple[str, ...]:
        return tuple(normalize_key(values.get(f), case_sensitive=self.case_sensitive) for f in self.key_fields)

    def _build_index(self, rows: list[dict[str, JSON]]) -> dict[tuple[str, ...], list[dict[str, JSON]]]:
        index: dict[tuple[str, ...], list[dict[str, JSON]]] = {}
        for i, row in enumerate(rows):
            absent = [f for f in self.key_fields if f not in row]
            if absent:
                raise ValueError(f"{self.name}: row {i} has no key field {absent[0]!r} (fields: {sorted(row)})")
            key = self._key(row)
            if key in index and not self.many:
                raise ValueError(f"{self.name}: rows {i} and an earlier one share the key {key!r}; "
                                 "pass many=True to return every matching row")
            index.setdefault(key, []).append(row)
        return index


def normalize_key(value: JSON, *, case_sensitive: bool = False) -> str:
    """The text a key value is compared as: numbers canonical, whitespace collapsed, case folded."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _number_text(value)
    text = " ".join(str(value).split())
    if _NUMBER.fullmatch(text):  # "42", " 42 " and "42.0" are the number 42; "042" stays text (an id)
        return _number_text(int(text) if text.lstrip("+-").isdigit() else float(text))
    return text if case_sensitive else text.casefold()


def _number_text(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


def _blank(value: JSON) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _shown(value: JSON) -> JSON:
    return " ".join(value.split()) if isinstance(value, str) else value


def _parameters(rows: list[dict[str, JSON]], key_fields: tuple[str, ...], docs: Mapping[str, str]) -> dict[str, JSON]:
    """The JSON schema of the key fields; a field is an integer/number only if every row says so."""
    properties: dict[str, JSON] = {}
    for field in key_fields:
        values = [r[field] for r in rows]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            kind = "integer"
        elif values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            kind = "number"
        else:
            kind = "string"
        properties[field] = {"type": kind}
        if field in docs:
            properties[field]["description"] = docs[field]
    return {"type": "object", "properties": properties, "required": list(key_fields), "additionalProperties": False}
