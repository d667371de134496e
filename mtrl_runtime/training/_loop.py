"""The training loop, synchronous or asynchronous, as one schedule with a staleness bound ``s``.

Before training step ``t`` the loop makes sure the rollouts of every step up
to ``t + s`` are being collected, then waits for step ``t``'s batch and
trains on it while the later steps' rollouts keep running. A batch for step
``u`` therefore starts only once ``u - s`` updates are done, so its rollouts
begin at most ``s`` versions behind the policy that trains on them;
``s = 0`` is the synchronous loop (collect, train, collect...). The sample
filter (``_batch.prepare_batch``) still drops and counts any sample more
than ``s`` versions away, which happens when an engine serves a version
late (adapters pushed to another process) or rollouts are reused on resume.

Per step: advantages → samples → update (``_weights``) → metrics (store
history via the checkpoint commit, MLflow now) → a checkpoint every
``advanced.checkpoint_every`` steps and after the last one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..algorithms import AdvantageParams
from ..config import MtrlConfig
from ._batch import prepare_batch
from ._checkpoint import Checkpoints
from ._data import TaskSchedule
from ._dispatcher import Dispatcher, StepBatch
from ._metrics import rollout_metrics
from ._resume import ResumePlan


@dataclass(frozen=True)
class StepReport:
    """What one step did, for progress displays and callers of ``train()``."""

    step: int
    max_steps: int
    metrics: dict[str, float]
    warnings: tuple[str, ...] = ()
    checkpoint: str | None = None


def off_policy_bound(config: MtrlConfig) -> int:
    """``s``: 0 for the synchronous loop, ``max_steps_off_policy`` when async is enabled."""
    async_cfg = config.advanced.async_config
    return async_cfg.max_steps_off_policy if async_cfg.enabled else 0


@dataclass
class TrainingLoop:
    """Runs steps ``start..max_steps-1`` (see the module docstring)."""

    config: MtrlConfig
    schedule: TaskSchedule
    dispatcher: Dispatcher
    weights: Any  # SharedWeights | PushedWeights
    checkpoints: Checkpoints
    tracker: Any | None = None
    resume: ResumePlan | None = None
    on_step: Callable[[StepReport], bool | None] | None = None  # returning True ends the run after that step
    extra_state: dict[str, Any] = field(default_factory=dict)

    @property
    def update(self) -> Any:
        return self.weights.update

    async def run(self, start: int) -> list[StepReport]:
        max_steps = self.config.core.max_steps
        bound = off_policy_bound(self.config)
        pending: dict[int, asyncio.Task[StepBatch]] = {}
        reports = []
        last_end = time.perf_counter()
        try:
            for step in range(start, max_steps):
                for ahead in range(step, min(step + bound, max_steps - 1) + 1):
                    if ahead not in pending:
                        pending[ahead] = asyncio.create_task(self._collect(ahead), name=f"mtrl-collect-{ahead}")
                waited = time.perf_counter()
                batch = await pending.pop(step)
                waited = time.perf_counter() - waited
                report = await self._train(batch, bound, waited, last_end)
                last_end = time.perf_counter()
                reports.append(report)
                if self.on_step is not None and self.on_step(report):
                    if report.checkpoint is None:  # stopping early: commit what was trained
                        await self._checkpoint(step + 1)
                    break
        finally:
            for task in pending.values():
                task.cancel()
            await asyncio.gather(*pending.values(), return_exceptions=True)
        return reports

    async def _collect(self, step: int) -> StepBatch:
        reuse = self.resume.for_step(step) if self.resume is not None else None
        return await self.dispatcher.collect(step, self.schedule.batch(step), reuse)

    async def _train(self, batch: StepBatch, bound: int, waited: float, last_end: float) -> StepReport:
        core = self.config.core
        params = AdvantageParams(success_threshold=core.success_threshold)
        prepared = prepare_batch(batch.groups, core.advantage_method, params, int(self.update.version), bound)
        started = time.perf_counter()
        if prepared.samples:
            update_metrics = await self.weights.apply(prepared.samples)
        else:  # nothing carries signal (e.g. every group had equal rewards): no update this step
            update_metrics = {"train/skipped": 1.0, "train/policy_version": float(self.update.version)}
        now = time.perf_counter()
        metrics = rollout_metrics(batch.rollouts)
        metrics.update(batch.failure_metrics())
        metrics.update(prepared.metrics)
        metrics.update(update_metrics)
        metrics.update({
            "time/rollout": batch.seconds,
            "time/rollout_wait": waited,
            "time/update": now - started,
            "time/step": now - last_end,
            "rollout/first_policy_version": float(batch.first_version),
        })
        if self.tracker is not None:
            self.tracker.log_metrics(batch.step, metrics)
            self.tracker.log_rollouts(batch.rollouts, batch.step)
        self.checkpoints.record(batch.step, prepared.rollout_ids, metrics)
        saved = await self._maybe_checkpoint(batch.step + 1)
        return StepReport(batch.step, core.max_steps, metrics, batch.warnings, saved)

    async def _maybe_checkpoint(self, next_step: int) -> str | None:
        every = self.config.advanced.checkpoint_every
        due = next_step == self.config.core.max_steps or (every > 0 and next_step % every == 0)
        return await self._checkpoint(next_step) if due else None

    async def _checkpoint(self, next_step: int) -> str:
        folder = await asyncio.to_thread(
            self.checkpoints.save, next_step, self.update, self.schedule.position(next_step), self.extra_state
        )
        return str(folder)


__all__ = ["StepReport", "TrainingLoop", "off_policy_bound"]
