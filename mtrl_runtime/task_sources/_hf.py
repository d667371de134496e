"""Hugging Face ``datasets``: folders written by ``save_to_disk``, and Dataset / DatasetDict objects in memory.

``datasets`` is imported only to read a saved folder; an object in memory
is recognised only if ``datasets`` (or pandas, for a DataFrame) is already
imported, since whoever built it imported it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ._problems import DatasetError
from ._raw import RawRow, RawRows, need
from ._spec import SPLIT_SEPARATOR

SAVED_MARKERS = ("dataset_dict.json", "state.json")  # DatasetDict.save_to_disk, Dataset.save_to_disk


def _dataset_rows(dataset: Any, default_split: str | None = None, split_chosen: bool = False) -> RawRows:
    own = dataset.split  # a NamedSplit (load_dataset(..., split=...)) or None
    rows = dataset.with_format(None).to_list()  # python values whatever format the user set (numpy, torch ...)
    return RawRows([RawRow(row) for row in rows], default_split or (str(own) if own is not None else None),
                   split_chosen)


def _pick(splits: Any, split: str | None, source: str, hint: str) -> tuple[Any, str]:
    names = list(splits)
    if split is None:
        if len(names) == 1:
            return splits[names[0]], names[0]
        raise DatasetError(source, f"holds the splits {names}; pick one: {hint.format(split=names[0])}")
    if split not in splits:
        raise DatasetError(source, f"has no split {split!r}; its splits: {names}")
    return splits[split], split


def is_saved_folder(path: Path) -> bool:
    return any((path / marker).is_file() for marker in SAVED_MARKERS)


def read_saved(path: Path, split: str | None) -> RawRows:
    """A folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (then ``split`` picks one)."""
    source = repr(str(path))
    if not is_saved_folder(path):
        markers = " or ".join(SAVED_MARKERS)
        raise DatasetError(source, f"is a folder, but not one written by save_to_disk (no {markers}); "
                                   "name a file (.jsonl, .json, .csv, .parquet, .arrow) instead")
    datasets = need("datasets", source, "a save_to_disk folder")
    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as err:
        raise DatasetError(source, f"cannot be loaded with datasets.load_from_disk: {err}") from None
    if isinstance(loaded, datasets.DatasetDict):
        dataset, chosen = _pick(loaded, split, source, f"'{path}{SPLIT_SEPARATOR}{{split}}'")
        return _dataset_rows(dataset, chosen, split_chosen=True)
    return _dataset_rows(loaded)


def in_memory_rows(source: Any) -> RawRows | None:
    """The rows of a ``datasets.Dataset`` / ``DatasetDict`` or a pandas DataFrame; None for anything else."""
    datasets = sys.modules.get("datasets")
    if datasets is not None:
        if isinstance(source, (datasets.DatasetDict, datasets.IterableDatasetDict)):
            name = type(source).__name__
            dataset, chosen = _pick(source, None, f"(a {name})", "load_tasks(dataset[{split!r}])")
            if isinstance(dataset, datasets.Dataset):
                return _dataset_rows(dataset, chosen, split_chosen=True)
            return RawRows([RawRow(row) for row in dataset], chosen, split_chosen=True)
        if isinstance(source, datasets.Dataset):
            return _dataset_rows(source)
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(source, pandas.DataFrame):
        return RawRows([RawRow(row) for row in source.to_dict("records")])
    return None


__all__ = ["SAVED_MARKERS", "in_memory_rows", "is_saved_folder", "read_saved"]
