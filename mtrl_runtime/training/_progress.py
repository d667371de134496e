"""The progress display of ``mtrl train``: step, reward and seconds per step (rich).

On a terminal it is a live bar; elsewhere (logs, CI) one line per step.
Warnings of a step (an environment problem, a diagnosis with its first fix)
and the results of a validation pass are printed as they come.
"""

from __future__ import annotations

from typing import Any

from ..diagnostics import VAL_REWARD
from ..evaluation import PASS_K_PREFIX
from ._loop import StepReport

STRICT_SUCCESS = "val/strict/success_rate"


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
            self.console.print(f"step {report.step + 1}/{report.max_steps}  reward {reward:.3f}  {pace:.2f} s/step")
        if report.checkpoint:
            self.console.print(f"checkpoint: {report.checkpoint}", style="dim")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def validation_line(metrics: dict[str, float]) -> str:
    """``validation: reward 0.412  pass@1 0.375  pass@8 0.750  strict 0.250`` from a step's ``val/...`` metrics."""
    parts = [f"reward {metrics[VAL_REWARD]:.3f}"]
    ks = sorted(int(name[len(PASS_K_PREFIX):]) for name in metrics if name.startswith(PASS_K_PREFIX))
    shown = sorted({ks[0], ks[-1]}) if ks else []  # the smallest and the largest k
    parts += [f"pass@{k} {metrics[f'{PASS_K_PREFIX}{k}']:.3f}" for k in shown]
    if STRICT_SUCCESS in metrics:
        parts.append(f"strict {metrics[STRICT_SUCCESS]:.3f}")
    return "validation: " + "  ".join(parts)


__all__ = ["ProgressDisplay", "validation_line"]
