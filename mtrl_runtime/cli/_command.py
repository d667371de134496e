"""What one ``mtrl`` subcommand is: a name, a line of help, its flags and what it runs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Command:
    """An ``mtrl`` subcommand. ``add_args`` declares its flags; ``run`` does the work and returns the exit status.

    ``loads_models``: whether it may load a transformers model class; the
    ``mtrl`` executable then leaves scikit-learn out of transformers' imports
    before running it (``_imports``), which a command that loads none would
    pay for without use.
    """

    name: str
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    loads_models: bool = True


__all__ = ["Command"]
