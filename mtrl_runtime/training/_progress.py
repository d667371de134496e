"""The progress display of ``mtrl train``: a start line, heartbeats during a step, a line per step (rich).

On a terminal it is a live bar whose status field shows the current step's
rollouts done/total, turns, tool calls and errors; elsewhere (logs, CI):

- at start, one line: model, engine, run folder, MLflow URI;
- during a step, a heartbeat line at most every ``heartbeat_s`` seconds
  (30 by default): rollouts done/total, turns, tool calls, errors;
- per step, one line: reward, strict success when a validation pass with a
  strict scorer ran, and the time split between rollouts and the update.

Warnings of a step (an environment problem, a diagnosis with its first fix)
and the results of a validation pass are printed as they come.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from ..coordinator import CoordinatorCounters
from ..diagnostics import VAL_REWARD
from ..evaluation import PASS_K_PREFIX
from ..rollouts import HEARTBEAT_S, Heartbeat, RolloutTally
from ._dynamic_sampling import REFILLED, USEFUL
from ._loop import StepReport

STRICT_SUCCESS = "val/strict/success_rate"
TTY_REFRESH_S = 1.0  # a live bar's status field refreshes this often


class ProgressDisplay:
    """A context manager; call it with each StepReport."""

    def __init__(self, max_steps: int, console: Any = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        from rich.console import Console

        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s: must be > 0, got {heartbeat_s}")
        self.max_steps = max_steps
        self.console = console or Console(stderr=True)
        self.heartbeat_s = heartbeat_s
        self._progress: Any = None
        self._task: Any = None
        self._beat: Heartbeat | None = None
        self._beating: asyncio.Task[None] | None = None

    def attach(
        self, info: Mapping[str, Any], tally: RolloutTally, counters: CoordinatorCounters, start_step: int
    ) -> None:
        """Print the start line (``info``: model, engine, run folder, MLflow URI) and start the heartbeat.

        Call from the run's event loop; ``detach`` stops the heartbeat.
        """
        self._say("mtrl: " + ", ".join(f"{k} {v}" for k, v in info.items()))
        live = self._progress is not None
        self._beat = Heartbeat(tally, counters, self._heartbeat, TTY_REFRESH_S if live else self.heartbeat_s)
        self._mark(start_step)
        self._beating = asyncio.create_task(self._beat.run(), name="mtrl-heartbeat")

    def detach(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            self._beating = None

    def _mark(self, step: int) -> None:
        if self._beat is not None:
            self._beat.mark(f"step {step + 1}/{self.max_steps}", key=step)

    def _say(self, line: str) -> None:
        """One plain line, never wrapped (logs are read by tools as well as people)."""
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _heartbeat(self, line: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, status=line)
        else:
            self._say(line)

    def __enter__(self) -> "ProgressDisplay":
        if self.console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
                BarColumn(),
                TextColumn("reward {task.fields[reward]}"),
                TextColumn("{task.fields[pace]} s/step"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=self.console,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.max_steps, reward="-", pace="-", status="")
        return self

    def __call__(self, report: StepReport) -> None:
        from rich.markup import escape

        reward = report.metrics.get("rollout/reward/mean", 0.0)
        pace = report.metrics.get("time/step", 0.0)
        for line in report.warnings:  # diagnoses start "[error] rule: ...": escape, or rich reads a tag
            self.console.print(f"[yellow]warning[/yellow]: {escape(line)}")
        if VAL_REWARD in report.metrics:
            self.console.print(validation_line(report.metrics))
        if self._progress is not None:
            self._progress.update(self._task, completed=report.step + 1, reward=f"{reward:.3f}", pace=f"{pace:.2f}")
        else:
            self._say(step_line(report))
        if report.checkpoint:
            self.console.print(f"checkpoint: {report.checkpoint}", style="dim")
        self._mark(report.step + 1)

    def __exit__(self, *exc: object) -> None:
        self.detach()
        if self._progress is not None:
            self._progress.stop()


def step_line(report: StepReport) -> str:
    """``step 3/10  reward 0.412  strict 0.250  rollouts 12.3 s  update 4.5 s  step 17.0 s``
    (``refilled 3 (8 useful groups)`` after the reward when dynamic sampling drew extra tasks)."""
    m = report.metrics
    parts = [f"step {report.step + 1}/{report.max_steps}", f"reward {m.get('rollout/reward/mean', 0.0):.3f}"]
    if STRICT_SUCCESS in m:
        parts.append(f"strict {m[STRICT_SUCCESS]:.3f}")
    if m.get(REFILLED):  # dynamic sampling drew extra tasks for groups without signal
        parts.append(f"refilled {m[REFILLED]:.0f} ({m.get(USEFUL, 0.0):.0f} useful groups)")
    parts += [f"rollouts {m.get('time/rollout', 0.0):.1f} s", f"update {m.get('time/update', 0.0):.1f} s",
              f"step {m.get('time/step', 0.0):.1f} s"]
    return "  ".join(parts)


def validation_line(metrics: dict[str, float]) -> str:
    """``validation: reward 0.412  pass@1 0.375  pass@8 0.750  strict 0.250`` from a step's ``val/...`` metrics."""
    parts = [f"reward {metrics[VAL_REWARD]:.3f}"]
    ks = sorted(int(name[len(PASS_K_PREFIX):]) for name in metrics if name.startswith(PASS_K_PREFIX))
    shown = sorted({ks[0], ks[-1]}) if ks else []  # the smallest and the largest k
    parts += [f"pass@{k} {metrics[f'{PASS_K_PREFIX}{k}']:.3f}" for k in shown]
    if STRICT_SUCCESS in metrics:
        parts.append(f"strict {metrics[STRICT_SUCCESS]:.3f}")
    return "validation: " + "  ".join(parts)


__all__ = ["ProgressDisplay", "step_line", "validation_line"]
