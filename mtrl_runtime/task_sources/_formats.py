"""The dataset formats tasks are read from: a registry, name -> reader, picked by file suffix (or a folder)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..registry import Registry
from ._columnar import read_arrow, read_parquet
from ._hf import read_saved
from ._problems import DatasetError
from ._raw import RawRows
from ._spec import SourceSpec
from ._text import read_csv, read_json, read_jsonl


@dataclass(frozen=True)
class TaskFormat:
    """One format: the file suffixes it claims (none: a folder) and its reader, ``read(path, split)``.

    ``split`` reaches the reader, which may take it (a DatasetDict's split); if it does not, the rows whose
    split is ``split`` are kept afterwards.
    """

    suffixes: tuple[str, ...]
    read: Callable[[Path, str | None], RawRows]

    def describe(self) -> str:
        return "/".join(self.suffixes) or "a folder written by save_to_disk"


TASK_FORMATS: Registry[TaskFormat] = Registry("dataset format")
TASK_FORMATS.register("jsonl")(TaskFormat((".jsonl",), lambda path, split: read_jsonl(path)))
TASK_FORMATS.register("json")(TaskFormat((".json",), lambda path, split: read_json(path)))
TASK_FORMATS.register("csv")(TaskFormat((".csv",), lambda path, split: read_csv(path)))
TASK_FORMATS.register("parquet")(TaskFormat((".parquet",), lambda path, split: read_parquet(path)))
TASK_FORMATS.register("arrow")(TaskFormat((".arrow",), lambda path, split: read_arrow(path)))
TASK_FORMATS.register("save_to_disk")(TaskFormat((), read_saved))


def known_formats() -> str:
    return ", ".join(TASK_FORMATS.get(name).describe() for name in TASK_FORMATS)


def format_for(spec: SourceSpec) -> TaskFormat:
    """The format of ``spec.path``: a folder's (save_to_disk) or its suffix's; a DatasetError naming the path
    and the known formats when it is missing or its suffix is unknown."""
    path = spec.path
    if path.is_dir():
        return TASK_FORMATS.get("save_to_disk")
    if not path.exists():
        raise DatasetError(repr(str(spec)), f"no such file or folder ({path.resolve()})")
    suffix = path.suffix.lower()
    for name in TASK_FORMATS:
        if suffix in TASK_FORMATS.get(name).suffixes:
            return TASK_FORMATS.get(name)
    raise DatasetError(repr(str(spec)), f"unknown format {suffix or '(no suffix)'!r}; known: {known_formats()}")


def read_source(spec: SourceSpec) -> RawRows:
    return format_for(spec).read(spec.path, spec.split)


__all__ = ["TASK_FORMATS", "TaskFormat", "format_for", "known_formats", "read_source"]
