"""Package attributes that load on first use (PEP 562), for packages whose public names pull in heavy modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> tuple[
        Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``exports`` maps a public name to its module (relative to
    ``package``); a name is imported on its first lookup and kept in ``namespace`` (the package's globals)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
