"""What one ``mtrl`` subcommand is: a name, a line of help, its flags and what it runs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Command:
    """An ``mtrl`` subcommand. ``add_args`` declares its flags; ``run`` does the work and returns the exit status."""

    name: str
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


__all__ = ["Command"]
