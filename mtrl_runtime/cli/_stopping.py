"""Stopping a run by hand: SIGTERM handled like Ctrl-C, and what to tell the person afterwards.

``asyncio.run`` answers the first SIGINT by cancelling the run's main task:
the dispatcher ends every rollout in flight with ``RunStopped`` (stored as
``interrupted``) before the stack closes. ``stop_on_sigterm`` routes SIGTERM
to the same handler. ``stopped_message`` says how many rollouts were marked
and how to go on (``--resume`` from the latest checkpoint, or start over
when none was written yet).
"""

from __future__ import annotations

import argparse
import shlex
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM does what SIGINT does (the handler installed at that moment); restored on exit."""

    def as_sigint(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signum, frame)
        else:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, as_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def resume_command(args: argparse.Namespace) -> str:
    """The ``mtrl train`` command line that continues the run ``args`` started, with ``--resume``."""
    parts = ["mtrl", "train", args.config, "--agent", args.agent]
    for flag, value in (("--dataset", args.dataset), ("--run-dir", args.run_dir), ("--max-steps", args.max_steps),
                        ("--val-dataset", args.val_dataset), ("--val-split", args.val_split),
                        ("--strict", args.strict)):
        if value is not None:
            parts += [flag, str(value)]
    if args.no_mlflow:
        parts.append("--no-mlflow")
    return shlex.join([*parts, "--resume"])


def stopped_message(config: Any, since: float, resume: str) -> str:
    """What a stopped ``mtrl train`` prints: the rollouts it marked interrupted and how to continue."""
    from ..store import open_store
    from ..training import CHECKPOINTS

    run_dir = Path(config.run_dir)
    marked = 0
    store_path = run_dir / "trajectories.db"
    if store_path.is_file():
        store = open_store(store_path)
        try:
            marked = sum(1 for r in store.rollouts(status="interrupted", with_turns=False)
                         if r.finished_at is not None and r.finished_at >= since)
        finally:
            store.close()
    checkpoints = sorted((run_dir / CHECKPOINTS).glob("step-*"))
    lines = [f"mtrl: stopped; {marked} rollouts in flight were marked interrupted in {store_path}"]
    if checkpoints:
        lines.append(f"mtrl: resume from {checkpoints[-1]} with: {resume}")
    else:
        lines.append(f"mtrl: no checkpoint was written yet; start again with: {resume.removesuffix(' --resume')}")
    return "\n".join(lines)


__all__ = ["resume_command", "stop_on_sigterm", "stopped_message"]
