"""A run stopped by hand is stopped once, and that stop runs to its end.

``asyncio.run`` answers the first Ctrl-C (and a SIGTERM the CLI routes to
it, ``cli._stopping``) by cancelling the run's main task: the dispatcher
ends every rollout in flight as ``interrupted``, the coordinator cancels
their generations, and the stack writes the ends, stops the server, closes
the store and joins the engine's thread. A second signal raises
``KeyboardInterrupt`` out of the event loop instead, wherever the stop is:
its writes never run (the rollouts stay ``running`` in the store), and the
hf engine's worker thread, a daemon still inside a torch kernel, meets the
interpreter's exit and aborts the process ("terminate called without an
active exception", status 134) after the run said it had stopped.

``run_to_stop`` is ``asyncio.run`` for the blocking entry points
(``MultiTurnRLTrainer.train``, ``MultiTurnRLEvaluator.evaluate``): while the
run stops, a further SIGINT says so on stderr and is otherwise ignored;
SIGKILL still ends the process at once, and the line names it. Outside the
main thread, or where ``asyncio.run`` installed no handler of its own (the
process had Ctrl-C ignored or handled already), nothing changes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Coroutine, Iterator, TypeVar

T = TypeVar("T")


def stopping_line(pid: int) -> bytes:
    """What a signal that comes while the run stops prints (stderr)."""
    return (f"mtrl: already stopping: the rollouts in flight are being recorded as interrupted and the engine and "
            f"the store closed; to end the process now, leaving them 'running': kill -KILL {pid}\n").encode()


@contextmanager
def _later_stops_said() -> Iterator[None]:
    """Inside ``asyncio.run``: its SIGINT handler runs for the first signal only; later ones print
    ``stopping_line`` (written with ``os.write``: a signal handler may interrupt a print to stderr)."""
    installed = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(installed) \
            or installed is signal.default_int_handler:
        yield
        return
    seen = False

    def once(signum: int, frame: Any) -> None:
        nonlocal seen
        if seen:
            os.write(2, stopping_line(os.getpid()))
            return
        seen = True
        installed(signum, frame)

    signal.signal(signal.SIGINT, once)
    try:
        yield
    finally:  # asyncio.run restores the default only when its own handler is the one installed
        if signal.getsignal(signal.SIGINT) is once:
            signal.signal(signal.SIGINT, installed)


async def _guarded(main: Coroutine[Any, Any, T]) -> T:
    with _later_stops_said():
        return await main


def run_to_stop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, where the first Ctrl-C stops the run and later ones do not cut that stop short."""
    return asyncio.run(_guarded(main))


__all__ = ["run_to_stop", "stopping_line"]
