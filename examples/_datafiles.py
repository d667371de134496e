"""The committed data files of an example: split rows as JSONL, write, find stale files, read a split, the CLI.

Each example's ``data.py`` generates its files as ``{relative path: text}``
from a seed; these helpers are what every example does with that mapping.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

Files = dict[str, str]


def jsonl(rows: Iterable[Mapping[str, Any]]) -> str:
    """One JSON object a line, each line ending with a newline."""
    return "".join(json.dumps(row) + "\n" for row in rows)


def split_instances(items: Sequence[Any], split_sizes: Mapping[str, int],
                    make_row: Callable[[Any, str, int], Mapping[str, Any]]) -> Files:
    """``instances/<split>.jsonl`` for consecutive slices of ``items``, sized by ``split_sizes`` in order."""
    files: Files = {}
    start = 0
    for split, size in split_sizes.items():
        files[f"instances/{split}.jsonl"] = jsonl(make_row(item, split, i)
                                                  for i, item in enumerate(items[start:start + size]))
        start += size
    return files


def write_files(files: Files, root: Path) -> list[Path]:
    """Write ``files`` under ``root``; returns the paths written."""
    written = []
    for rel, text in files.items():
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
        written.append(path)
    return written


def stale_paths(files: Files, root: Path) -> list[str]:
    """The paths of ``files`` whose committed copy under ``root`` is missing or differs."""
    return [rel for rel, text in files.items()
            if not (Path(root) / rel).exists() or (Path(root) / rel).read_bytes() != text.encode("utf-8")]


def read_split(root: Path, split: str, split_sizes: Mapping[str, int]) -> list[dict[str, Any]]:
    """The committed instances of one split; an unknown split is an error naming it."""
    if split not in split_sizes:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(split_sizes)}")
    lines = (Path(root) / "instances" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def data_main(argv: Sequence[str] | None, program: str, write: Callable[[], list[Path]],
              stale: Callable[[], list[str]]) -> int:
    """``python -m <program> [--check]``: regenerate the files, or report whether they are up to date."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--check"]:
        found = stale()
        print("stale: " + ", ".join(found) if found else "up to date")
        return 1 if found else 0
    if args:
        raise SystemExit(f"usage: python -m {program} [--check]; got {args}")
    for path in write():
        print(path)
    return 0


__all__ = ["Files", "data_main", "jsonl", "read_split", "split_instances", "stale_paths", "write_files"]
