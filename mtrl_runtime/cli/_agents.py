"""Load a user's function named on the command line (``--agent``, ``--strict``): shared by train, eval and check."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


def load_agent(spec: str, flag: str = "--agent") -> Any:
    """The function named by ``module:function`` or ``file.py:function`` (``flag`` names it in errors)."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"{flag}: expected module:function or file.py:function, got {spec!r}")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{flag}: no file {target!r}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        sys.path.insert(0, str(path.parent))
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(target)
    agent = getattr(module, name, None)
    if not callable(agent):
        raise ValueError(f"{flag}: {target!r} has no function {name!r}")
    return agent


__all__ = ["load_agent"]
