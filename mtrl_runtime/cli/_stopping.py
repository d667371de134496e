"""Stopping a run by hand: SIGTERM handled like Ctrl-C, and what to tell the person afterwards.

``asyncio.run`` answers the first SIGINT by cancelling the run's main task:
the dispatcher ends every rollout in flight with ``RunStopped`` (stored as
``interrupted``) before the stack closes. ``stop_on_sigterm`` routes SIGTERM
to the same handler. ``stopped_message`` says how many rollouts were marked
and how to go on (``--resume`` from the latest checkpoint, or start over
when none was written yet).

A process can start with Ctrl-C switched off: a non-interactive shell
starts a background job (``mtrl train ... &`` in a script) with SIGINT
ignored, and a program can leave it blocked in the mask its children
inherit. mtrl keeps that choice and says so when it starts, naming the
signal that does stop the run (``ctrl_c_note``); SIGTERM, if it came
blocked, is unblocked while the run lasts, so that ``kill`` still works.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")


def _blocked() -> set[int]:
    """The signals this thread blocks (none where the platform has no signal masks)."""
    if sys.platform == "win32":
        return set()
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def ctrl_c_note(pid: int) -> str | None:
    """The line to print when Ctrl-C cannot stop this process (SIGINT ignored or blocked as it started)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if not ignored and signal.SIGINT not in _blocked():
        return None
    how = "ignored" if ignored else "blocked"
    why = " (a script's background job starts so)" if ignored else ""
    return (f"mtrl: Ctrl-C (SIGINT) is {how} in this process, as the program that started it left it{why}; "
            f"stop the run with: kill -TERM {pid}")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def stop_on_sigterm(say: Callable[[str], None] = _say) -> Iterator[None]:
    """While inside, SIGTERM does what SIGINT does (the handler installed at that moment); restored on exit.

    When Ctrl-C cannot stop the process, ``say`` gets ``ctrl_c_note``'s line first; a blocked SIGTERM is
    unblocked while inside; and a run (``rollouts.run_to_stop``) takes SIGTERM over to cancel itself, as
    Ctrl-C would have, rather than have ``KeyboardInterrupt`` raised wherever it is."""
    from ..rollouts import sigterm_as_ctrl_c  # here, not above: --help imports no runtime

    note = ctrl_c_note(os.getpid())
    if note is not None:
        say(note)
    unblock = {signal.SIGTERM} & _blocked()
    previous = signal.signal(signal.SIGTERM, sigterm_as_ctrl_c)
    if unblock:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
    try:
        yield
    finally:
        if unblock:
            signal.pthread_sigmask(signal.SIG_BLOCK, unblock)
        signal.signal(signal.SIGTERM, previous)


def resume_command(args: argparse.Namespace) -> str:
    """The ``mtrl train`` command line that continues the run ``args`` started, with ``--resume``."""
    parts = ["mtrl", "train", args.config] + (["--agent", args.agent] if args.agent is not None else [])
    for flag, value in (("--dataset", args.dataset), ("--run-dir", args.run_dir), ("--max-steps", args.max_steps),
                        ("--val-dataset", args.val_dataset), ("--val-split", args.val_split),
                        ("--strict", args.strict)):
        if value is not None:
            parts += [flag, str(value)]
    if args.no_mlflow:
        parts.append("--no-mlflow")
    return shlex.join([*parts, "--resume"])


def marked_interrupted(config: Any, store_path: Path, since: float) -> tuple[int, int]:
    """In the store at ``store_path``: the rollouts marked ``interrupted`` at or after ``since`` (a time.time()),
    and those still ``running`` (a stop that did not finish its writes: said, never passed over)."""
    from ..store import open_store

    if not store_path.is_file():
        return 0, 0
    store = open_store(store_path, config.core.store)
    try:
        marked = sum(1 for r in store.rollouts(status="interrupted", with_turns=False)
                     if r.finished_at is not None and r.finished_at >= since)
        return marked, len(store.rollouts(status="running", with_turns=False))
    finally:
        store.close()


def marked_line(what: str, marked: int, running: int, store_path: Path) -> str:
    """``mtrl: <what> stopped; N rollouts in flight were marked interrupted in <store>``, and the ones left
    ``running`` named by count when there are any."""
    line = f"mtrl: {what}stopped; {marked} rollouts in flight were marked interrupted in {store_path}"
    if running:
        line += f"; {running} still 'running' there: their end was not written before the process stopped"
    return line


def stopped_message(config: Any, since: float, resume: str) -> str:
    """What a stopped ``mtrl train`` prints: the rollouts it marked interrupted and how to continue."""
    folder = config.run_folder
    store_path = folder.store
    checkpoints = sorted(folder.checkpoints.glob("step-*"))
    lines = [marked_line("", *marked_interrupted(config, store_path, since), store_path)]
    if checkpoints:
        lines.append(f"mtrl: resume from {checkpoints[-1]} with: {resume}")
    else:
        lines.append(f"mtrl: no checkpoint was written yet; start again with: {resume.removesuffix(' --resume')}")
    return "\n".join(lines)


def run_until_stopped(command: str, heartbeat_s: float, work: Callable[[float], T],
                      stopped: Callable[[float], str]) -> T | None:
    """``work(heartbeat_s)`` with SIGTERM stopping it as Ctrl-C does (``stop_on_sigterm``): its result, or None
    when it was stopped, after printing ``stopped(started)`` (what was marked, how to go on) to stderr.

    ``heartbeat_s`` is the command's ``--heartbeat``, refused here, naming it and its value, unless it is > 0."""
    if heartbeat_s <= 0:
        raise SystemExit(f"mtrl {command}: --heartbeat must be > 0 seconds, got {heartbeat_s}")
    started = time.time()
    try:
        with stop_on_sigterm():
            return work(heartbeat_s)
    except KeyboardInterrupt:
        print(stopped(started), file=sys.stderr, flush=True)
        return None


__all__ = ["ctrl_c_note", "marked_interrupted", "marked_line", "resume_command", "run_until_stopped",
           "stop_on_sigterm", "stopped_message"]
