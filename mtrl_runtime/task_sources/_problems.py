"""What is wrong with a dataset: the bad rows, each with its index and field, or the source as a whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MAX_LISTED = 20
"""How many bad rows one error lists; the rest are counted."""


@dataclass(frozen=True)
class RowProblem:
    """One bad row: its 0-based ``index`` among the source's rows, the ``field`` at fault (None: the row
    itself), what is wrong, and ``where`` it is in a text file (``line 5``)."""

    index: int
    field: str | None
    message: str
    where: str = ""

    def __str__(self) -> str:
        place = f"row {self.index} ({self.where})" if self.where else f"row {self.index}"
        return f"{place}: {self.field}: {self.message}" if self.field else f"{place}: {self.message}"


class DatasetError(ValueError):
    """A dataset that cannot become tasks: a missing or unreadable source, or bad rows (all listed, up to
    ``MAX_LISTED``). No run starts on one: training, evaluation, ``mtrl collect`` and the checks all load
    their tasks before anything else."""

    def __init__(self, source: str, message: str = "", problems: Sequence[RowProblem] = (),
                 rows: int | None = None) -> None:
        self.source = source
        self.problems = tuple(problems)
        self.rows = rows
        if self.problems:
            listed = [f"  {p}" for p in self.problems[:MAX_LISTED]]
            if len(self.problems) > MAX_LISTED:
                listed.append(f"  ... and {len(self.problems) - MAX_LISTED} more bad rows")
            of = f" of {rows}" if rows is not None else ""
            bad = len({p.index for p in self.problems})
            head = f"dataset {source}: {bad} bad row{'s' if bad != 1 else ''}{of} (nothing runs until they are fixed)"
            message = "\n".join([f"{head}{': ' + message if message else ''}", *listed])
        else:
            message = f"dataset {source}: {message}"
        super().__init__(message)


__all__ = ["DatasetError", "MAX_LISTED", "RowProblem"]
