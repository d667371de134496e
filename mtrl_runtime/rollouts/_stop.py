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
SIGKILL still ends the process at once, and the line names it.

A process can start with Ctrl-C ignored (a script's background job), and
then ``asyncio.run`` installs no handler. Where SIGTERM's handler is
``sigterm_as_ctrl_c`` (the CLI's, ``cli._stopping.stop_on_sigterm``), the
run takes SIGTERM over while it runs: the first one cancels the main task as
Ctrl-C would have, and the run ends with ``KeyboardInterrupt`` as a Ctrl-C
stop does; later ones print the line. That handler raising
``KeyboardInterrupt`` wherever the main thread happened to be (inside the
event loop, a lock, a library's progress bar) was the stop it replaces (a stopped
``mtrl train --resume``, run as a background job, was once seen hung at its
exit, in a progress bar's lock). Outside the main thread, or where Ctrl-C is
handled by someone else, nothing changes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Coroutine, Iterator, TypeVar

T = TypeVar("T")


def stopping_line(pid: int) -> bytes:
    """What a signal that comes while the run stops prints (stderr)."""
    return (f"mtrl: already stopping: the rollouts in flight are being recorded as interrupted and the engine and "
            f"the store closed; to end the process now, leaving them 'running': kill -KILL {pid}\n").encode()


def sigterm_as_ctrl_c(signum: int, frame: Any) -> None:
    """SIGTERM's handler while a command runs (``cli._stopping.stop_on_sigterm``): what SIGINT's handler does
    (``asyncio.run``'s cancels the run), or ``KeyboardInterrupt`` where Ctrl-C is ignored. Inside ``run_to_stop``
    the second case is replaced by a cancel of the run's main task (module docstring)."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signum, frame)
    else:
        raise KeyboardInterrupt


class _Stop:
    """The signal handling of one ``run_to_stop`` run (module docstring); ``by_sigterm``: it cancelled the run."""

    def __init__(self) -> None:
        self.seen = False
        self.by_sigterm = False

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Inside ``asyncio.run``'s main task: the first stop signal stops the run, later ones print
        ``stopping_line`` (written with ``os.write``: a signal handler may interrupt a print to stderr)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = signal.getsignal(signal.SIGINT)
        if callable(handled) and handled is not signal.default_int_handler:  # asyncio.run's: it stops the run
            with self._replaced(signal.SIGINT, lambda: handled(signal.SIGINT, None)):
                yield
        elif signal.getsignal(signal.SIGTERM) is sigterm_as_ctrl_c and not callable(handled):  # Ctrl-C ignored
            task, loop = asyncio.current_task(), asyncio.get_running_loop()
            assert task is not None

            def cancel() -> None:
                self.by_sigterm = True
                loop.call_soon_threadsafe(task.cancel)

            with self._replaced(signal.SIGTERM, cancel):
                yield
        else:
            yield

    @contextmanager
    def _replaced(self, signum: int, first: Callable[[], None]) -> Iterator[None]:
        installed = signal.getsignal(signum)

        def once(number: int, frame: Any) -> None:
            if self.seen:
                os.write(2, stopping_line(os.getpid()))
                return
            self.seen = True
            first()

        signal.signal(signum, once)
        try:
            yield
        finally:  # asyncio.run restores SIGINT's default only when its own handler is the one installed
            if signal.getsignal(signum) is once:
                signal.signal(signum, installed)


async def _guarded(main: Coroutine[Any, Any, T]) -> T:
    stop = _Stop()
    with stop.installed():
        try:
            return await main
        except asyncio.CancelledError:
            if stop.by_sigterm:  # as asyncio.run ends a run its Ctrl-C handler cancelled
                raise KeyboardInterrupt from None
            raise


def run_to_stop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, where the first Ctrl-C stops the run and later ones do not cut that stop short."""
    return asyncio.run(_guarded(main))


__all__ = ["run_to_stop", "sigterm_as_ctrl_c", "stopping_line"]
