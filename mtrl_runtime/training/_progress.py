"""The progress display of ``mtrl train``: step, reward and seconds per step (rich).

On a terminal it is a live bar; elsewhere (logs, CI) one line per step.
Warnings of a step (e.g. an environment problem) are printed as they come.
"""

from __future__ import annotations

from typing import Any

from ._loop import StepReport


class ProgressDisplay:
    """A context manager; call it with each StepReport."""

    def __init__(self, max_steps: int, console: Any = None) -> None:
        from rich.console import Console

        self.max_steps = max_steps
        self.console = console or Console(stderr=True)
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> "ProgressDisplay":
        if self.console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
                BarColumn(),
                TextColumn("reward {task.fields[reward]}"),
                TextColumn("{task.fields[pace]} s/step"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.max_steps, reward="-", pace="-")
        return self

    def __call__(self, report: StepReport) -> None:
        reward = report.metrics.get("rollout/reward/mean", 0.0)
        pace = report.metrics.get("time/step", 0.0)
        for line in report.warnings:
            self.console.print(f"[yellow]warning[/yellow]: {line}")
        if self._progress is not None:
            self._progress.update(self._task, completed=report.step + 1, reward=f"{reward:.3f}", pace=f"{pace:.2f}")
        else:
            self.console.print(f"step {report.step + 1}/{report.max_steps}  reward {reward:.3f}  {pace:.2f} s/step")
        if report.checkpoint:
            self.console.print(f"checkpoint: {report.checkpoint}", style="dim")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


__all__ = ["ProgressDisplay"]
