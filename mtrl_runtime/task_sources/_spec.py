"""How a dataset is named in a config or a flag: ``PATH`` or ``PATH::SPLIT``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._problems import DatasetError

SPLIT_SEPARATOR = "::"
SOURCE_HELP = ("a .jsonl, .json, .csv, .parquet or .arrow file of tasks, or a folder written by save_to_disk; "
               f"PATH{SPLIT_SEPARATOR}SPLIT takes one split (docs/datasets.md)")
"""What a ``--dataset`` flag's help says it takes."""


@dataclass(frozen=True)
class SourceSpec:
    """A dataset on disk and, optionally, the split to take from it.

    ``split`` picks that split of a folder written by ``DatasetDict.save_to_disk``;
    of a file (or a single saved Dataset) it keeps the rows whose split is ``split``.
    """

    path: Path
    split: str | None = None

    def __str__(self) -> str:
        return f"{self.path}{SPLIT_SEPARATOR}{self.split}" if self.split is not None else str(self.path)


def parse_source(source: str | Path) -> SourceSpec:
    """``PATH`` or ``PATH::SPLIT`` as a SourceSpec (a Path object is a path, never split); the syntax only,
    nothing is read (a config names files of the machine that runs it)."""
    if isinstance(source, Path):
        return SourceSpec(source)
    if not isinstance(source, str):
        raise DatasetError(repr(source),
                           f"expected a path (or PATH{SPLIT_SEPARATOR}SPLIT), got {type(source).__name__}")
    path, sep, split = source.rpartition(SPLIT_SEPARATOR)
    if not sep:
        path, split = source, ""
    if not path.strip() or (sep and not split.strip()):
        raise DatasetError(repr(source), f"expected PATH or PATH{SPLIT_SEPARATOR}SPLIT (e.g. data/tasks.parquet or "
                                         f"data/saved{SPLIT_SEPARATOR}train), with neither part empty")
    return SourceSpec(Path(path), split if sep else None)


__all__ = ["SOURCE_HELP", "SPLIT_SEPARATOR", "SourceSpec", "parse_source"]
