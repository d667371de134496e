"""The ``mtrl`` command: ``serve``, ``train``, ``eval``, ``check``, ``collect``, ``demo``, ``export``, ``online``, ``rescore`` and ``sft``.

Each subcommand lives in its own module as a ``Command`` (name, help,
flags, run); ``COMMANDS`` below is the one place a command is added. The
subcommand modules import nothing from this package's ``__init__``, so
the parser is built without an import circle. Heavy imports (torch, the
trainer, the server) stay inside each command's ``run``: ``mtrl --help``
loads none of them.
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Callable

from ..task_sources import DatasetError
from . import collect, demo, eval, export, online, rescore, serve, sft, train
from ._agents import load_agent
from ._command import Command
from ._imports import leave_out_sklearn

# In the order ``mtrl --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    eval.CHECK,
    collect.COLLECT,
    demo.DEMO,
    eval.EVAL,
    export.EXPORT,
    online.ONLINE,
    rescore.RESCORE,
    serve.SERVE,
    sft.SFT,
    train.TRAIN,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``mtrl`` argument parser, one subparser per command in ``COMMANDS``."""
    parser = argparse.ArgumentParser(prog="mtrl", description="Multi-turn RL for the agents you already have.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_args(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: list[str] | None = None, *, before_run: Callable[[Command], None] | None = None) -> int:
    """Run the ``mtrl`` command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    ``before_run``: called with the parsed command before it runs (``console`` prepares its process there).
    """
    args = build_parser().parse_args(argv)
    command = next(c for c in COMMANDS if c.name == args.command)
    if before_run is not None:
        before_run(command)
    try:
        return command.run(args)
    except DatasetError as err:  # bad rows, a missing file, an unknown split: the message says it all
        print(f"mtrl {command.name}: {err}", file=sys.stderr, flush=True)
        return 2


def _prepare_process(command: Command) -> None:
    """What the ``mtrl`` executable does to its own process before a command runs: a command that may load a
    model class imports it without scikit-learn (``_imports.leave_out_sklearn``)."""
    if command.loads_models:
        leave_out_sklearn()


def console() -> int:
    """The ``mtrl`` executable (and ``python -m mtrl_runtime.cli``): ``main``, then the objects it built are
    moved out of the garbage collector's reach (``gc.freeze``) before the interpreter exits.

    Before the command runs, ``_prepare_process`` leaves scikit-learn out of transformers' imports (about a
    fifth of what a training command spends importing; ``_imports``).

    Python's shutdown runs full collections over every object left, and a command that imported torch and
    transformers leaves millions: one scripted training step took 25.3 s with them and 22.8 s without
    (``docs/performance.md``, "The exit of a command"). What this gives up: an object left in a reference cycle
    is not finalized at exit. Each command closes what it opened (engines, servers, stores) before it returns,
    and ``atexit`` handlers (MLflow's flush, temp folders' finalizers) still run.
    ``main`` itself leaves the collector and the imports alone: tests call it in one long process.
    """
    status = main(before_run=_prepare_process)
    gc.freeze()
    return status


__all__ = ["COMMANDS", "Command", "build_parser", "console", "load_agent", "main"]
