"""What a reader hands back: the source's rows as read, before they become Tasks."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ._problems import DatasetError

INSTALL_HINT = "pip install 'mtrl-agents[datasets]'"


@dataclass(frozen=True)
class RawRow:
    """One row as read. ``where`` places it in a text file (``line 5``); ``unreadable`` says why a row
    could not be read at all (a line that is not JSON), and ``value`` is then None."""

    value: Any
    where: str = ""
    unreadable: str | None = None


@dataclass(frozen=True)
class RawRows:
    """A source's rows. ``default_split``: the split of a row that names none (a DatasetDict's split, a
    Dataset's own ``split``). ``split_chosen``: the reader already took only the split asked for."""

    rows: list[RawRow] = field(default_factory=list)
    default_split: str | None = None
    split_chosen: bool = False


def need(module: str, source: str, what: str) -> ModuleType:
    """``module`` imported, or a DatasetError saying which extra installs it (imported only when used)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DatasetError(source, f"reading {what} needs the {module!r} package: {INSTALL_HINT}") from None


__all__ = ["INSTALL_HINT", "RawRow", "RawRows", "need"]
