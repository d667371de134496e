"""The progress display of ``mtrl eval``: a start line, then the rollouts done/total while it runs.

Off a terminal (logs, CI), one heartbeat line at most every ``heartbeat_s``
seconds (30 by default); on a terminal, a rich status line refreshed every
second. The counts come from the dispatcher's tally and the coordinator's
counters (``rollouts.Heartbeat``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from ..coordinator import CoordinatorCounters
from ..rollouts import HEARTBEAT_S, Heartbeat, RolloutTally

TTY_REFRESH_S = 1.0


class EvalProgress:
    """A context manager; ``attach`` from the evaluation's event loop, ``detach`` when its rollouts are done."""

    def __init__(self, heartbeat_s: float = HEARTBEAT_S, console: Any = None) -> None:
        from rich.console import Console

        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s: must be > 0, got {heartbeat_s}")
        self.console = console or Console(stderr=True)
        self.heartbeat_s = heartbeat_s
        self._status: Any = None
        self._beating: asyncio.Task[None] | None = None

    def __enter__(self) -> "EvalProgress":
        return self

    def attach(self, info: Mapping[str, Any], tally: RolloutTally, counters: CoordinatorCounters) -> None:
        self._say("mtrl: " + ", ".join(f"{k} {v}" for k, v in info.items()))
        live = self.console.is_terminal
        if live:
            self._status = self.console.status("evaluation: starting")
            self._status.start()
        beat = Heartbeat(tally, counters, self._heartbeat, TTY_REFRESH_S if live else self.heartbeat_s)
        beat.mark("evaluation", key=None)
        self._beating = asyncio.create_task(beat.run(), name="mtrl-eval-heartbeat")

    def detach(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            self._beating = None
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _heartbeat(self, line: str) -> None:
        if self._status is not None:
            self._status.update(line)
        else:
            self._say(line)

    def _say(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def __exit__(self, *exc: object) -> None:
        self.detach()


__all__ = ["EvalProgress"]
