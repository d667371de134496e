"""The training monitor: diagnostics run on the metric history as steps finish, each finding said once.

``DiagnosticsMonitor.observe(step, metrics)`` appends a step's metrics
(training and, on validation steps, ``val/...``) to the history, runs
``diagnostics.diagnose`` and returns the findings not reported before; each
one is also written to ``<run_dir>/diagnostics.jsonl`` and, with a
tracker, to MLflow (metric ``diagnostics/<rule>`` = 1 at that step, and a
run tag ``mtrl.diagnosis.<rule>`` holding the message and the first fix).
A rule that stops firing and fires again later is reported again.

The trainer runs one inside its loop (each finding also lands in
``StepReport.warnings``); a resumed run ``preload``s the store's metric
history first, so rules keep counting from step 0 and a finding already
said before the crash is not said again. Used on its own as an ``on_step``
callback (``trainer.train(on_step=monitor)``) it reads
``StepReport.metrics`` and prints each finding with ``echo``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from .diagnostics import Diagnosis, diagnose, knobs_from_config
from .run_folder import RunFolder
from .tracking import NullTracker
from .types import RunTracker

_TAG_CHARS = 4500  # MLflow tag values are capped at 5000 characters


@runtime_checkable
class StepObserver(Protocol):
    """What the training loop asks of its monitor: a step's metrics in, the findings new at that step out."""

    def observe(
        self, step: int, metrics: Mapping[str, float], suspects: Sequence[str] = (),
        named: Mapping[str, Sequence[str]] | None = None,
    ) -> Sequence[Diagnosis]: ...


class DiagnosticsMonitor:
    """Keeps the metric history of a run and reports each new diagnosis (see the module docstring)."""

    def __init__(
        self,
        knobs: Mapping[str, Any],
        *,
        path: str | Path | None = None,
        tracker: RunTracker | None = None,
        echo: Callable[[str], None] | None = print,
    ) -> None:
        self.knobs = dict(knobs)
        self.path = Path(path) if path is not None else None
        self.tracker = tracker  # None: a NullTracker
        self.echo = echo
        self.history: list[dict[str, Any]] = []
        self._active: set[str] = set()  # rules whose finding stands (reported, still firing)

    @property
    def tracker(self) -> RunTracker:
        """Where findings go besides ``diagnostics.jsonl``: metric ``diagnostics/<rule>`` and a run tag."""
        return self._tracker

    @tracker.setter
    def tracker(self, tracker: RunTracker | None) -> None:
        self._tracker = tracker if tracker is not None else NullTracker()

    @classmethod
    def for_config(cls, config: Any, **kwargs: Any) -> "DiagnosticsMonitor":
        """A monitor with the config's knobs, writing ``<run_dir>/diagnostics.jsonl`` (``RunFolder.diagnostics``)."""
        kwargs.setdefault("path", RunFolder(config.core.run_dir).diagnostics)
        return cls(knobs_from_config(config), **kwargs)

    def preload(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Start from an earlier run's history; the findings standing at its end count as said."""
        self.history = [dict(entry) for entry in history]
        self._active = {d.rule for d in diagnose(self.history, self.knobs)} if self.history else set()

    def observe(
        self, step: int, metrics: Mapping[str, float], suspects: Sequence[str] = (),
        named: Mapping[str, Sequence[str]] | None = None,
    ) -> list[Diagnosis]:
        """Add one step's metrics; return (and log) the findings that are new at this step.

        ``suspects``: rollout ids to name when the reward-hacking rule fires
        (e.g. a validation pass's reward-only disagreements with the strict scorer).
        ``named``: the step's rollouts other rules name, by role (knob ``<role>_rollout_ids``): ``tripped``
        (the ``tripwire`` rule) and ``onset`` (the ``hack_onset`` rule: high reward, high entropy).
        """
        if suspects:
            self.knobs["top_rollout_ids"] = list(suspects)[:10]
        for role, ids in (named or {}).items():
            self.knobs[f"{role}_rollout_ids"] = list(ids)[:10]
        self.history.append({**metrics, "step": step})
        found = diagnose(self.history, self.knobs)
        new = [d for d in found if d.rule not in self._active]
        self._active = {d.rule for d in found}
        for diagnosis in new:
            self._log(step, diagnosis)
        return new

    def __call__(self, report: Any) -> list[Diagnosis]:
        """An ``on_step`` callback: observe ``report.metrics`` and print each new finding."""
        new = self.observe(report.step, report.metrics)
        if self.echo is not None:
            for diagnosis in new:
                self.echo(f"mtrl diagnosis at step {report.step}: {diagnosis}")
        return new

    def _log(self, step: int, diagnosis: Diagnosis) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            record = {"step": step, "time": time.time(), "rule": diagnosis.rule, "severity": diagnosis.severity.value,
                      "message": diagnosis.message, "first_fix": diagnosis.first_fix, "evidence": dict(diagnosis.evidence)}
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record, default=str) + "\n")
        self.tracker.log_metrics(step, {f"diagnostics/{diagnosis.rule}": 1.0})
        text = f"step {step}: {diagnosis.message} | first fix: {diagnosis.first_fix}"
        self.tracker.set_tag(f"mtrl.diagnosis.{diagnosis.rule}", text[:_TAG_CHARS])


def history_from_rows(rows: Iterable[tuple[int, str, float]]) -> list[dict[str, Any]]:
    """``TrajectoryStore.metric_history()`` rows ``(step, name, value)`` as one dict per step, in step order."""
    steps: dict[int, dict[str, Any]] = {}
    for step, name, value in rows:
        steps.setdefault(int(step), {"step": int(step)})[name] = value
    return [steps[s] for s in sorted(steps)]


__all__ = ["DiagnosticsMonitor", "StepObserver", "history_from_rows"]
