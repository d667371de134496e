"""Where the demo's time went, and how busy the machine was: the lines ``mtrl demo`` ends with.

A run that took 40 minutes may be a slow run or a shared machine; the split
(rollouts, update, evaluation) and the load sampled through the run
(``_load_sampler``: the load average every 15 s, and other processes' share of
the CPU time) tell which. The step reports' ``time/rollout`` and ``time/update`` are the
trainer's own measurements; the training and evaluation totals are wall time
around each phase (training's includes setup, checkpoints and what the two
parts do not cover, shown as "other").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from ._load_sampler import LoadSummary, load_line, load_verdict


@dataclass(frozen=True)
class DemoTiming:
    """Seconds per phase of one demo run and the machine's load while it ran."""

    training_s: float  # wall time of trainer.train()
    rollouts_s: float  # sum of the steps' time/rollout
    update_s: float  # sum of the steps' time/update
    evaluation_s: float  # wall time of the evaluation (base and trained)
    steps: int
    load: LoadSummary  # sampled from the start of training to the end of the evaluation
    own_threads: int  # the engine's CPU threads: the load the demo itself adds

    @property
    def total_s(self) -> float:
        return self.training_s + self.evaluation_s

    @property
    def other_s(self) -> float:
        """Training wall time neither rollouts nor update account for (setup, checkpoints; 0 when they overlap)."""
        return max(0.0, self.training_s - self.rollouts_s - self.update_s)


def demo_timing(
    step_metrics: Iterable[Mapping[str, float]], training_s: float, evaluation_s: float,
    load: LoadSummary, own_threads: int,
) -> DemoTiming:
    """Add up the steps' ``time/rollout`` and ``time/update`` (a step missing one is an error naming it)."""
    metrics = list(step_metrics)
    for i, m in enumerate(metrics):
        missing = [k for k in ("time/rollout", "time/update") if k not in m]
        if missing:
            raise ValueError(f"step_metrics[{i}]: no {', '.join(missing)} (the trainer logs both every step)")
    return DemoTiming(
        training_s=training_s,
        rollouts_s=sum(m["time/rollout"] for m in metrics),
        update_s=sum(m["time/update"] for m in metrics),
        evaluation_s=evaluation_s,
        steps=len(metrics),
        load=load,
        own_threads=own_threads,
    )


def timing_lines(t: DemoTiming, precision: str) -> list[str]:
    """The demo's closing lines: the split, the load against the cores, and what it means."""
    per_step = f", {t.training_s / t.steps:.0f} s a step" if t.steps else ""
    lines = [
        f"time: {_minutes(t.total_s)} in all = training {_minutes(t.training_s)} ({t.steps} steps{per_step}: "
        f"rollouts {_minutes(t.rollouts_s)}, update {_minutes(t.update_s)}, other {_minutes(t.other_s)}) "
        f"+ evaluation {_minutes(t.evaluation_s)}",
        f"machine: {t.load.cpus} CPU cores; {precision}",
        load_line(t.load, t.own_threads),
    ]
    shared, why = load_verdict(t.load, t.own_threads)
    if shared:
        lines.append(f"the machine was shared ({why}): other processes took CPU time, and these times are "
                     "longer than the run needs on a quiet machine")
    else:
        lines.append(f"the machine was quiet ({why}): these times are the run's own")
    return lines


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


__all__ = ["DemoTiming", "demo_timing", "timing_lines"]
