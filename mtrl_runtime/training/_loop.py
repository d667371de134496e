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

Collecting a step is ``_dynamic_sampling.sample_step``: the step's groups,
then, with ``advanced.dynamic_sampling``, refill rounds of extra tasks while
groups without signal leave the batch short (their own seeded stream; the
data position does not move).

Per step: advantages → samples → update (``_weights``) → metrics (store
history via the checkpoint commit, MLflow now) → diagnostics → a checkpoint
every ``advanced.checkpoint_every`` steps and after the last one.

Validation (with validation tasks and ``core.val_every > 0``): the pass "at
step ``s``" measures the policy after ``s`` updates, the one that generates
step ``s``'s rollouts. It runs at step 0 (the base model), at every multiple
of ``val_every``, and after the last step (at step ``max_steps``, or the
step after an early stop). A pass at a trained step runs while that step's
rollouts are collected; its ``val/...`` metrics join the step's metrics
(MLflow now, the store with the step's commit). The pass after the last
step runs once the final checkpoint is written, so it is logged to the
store at once; its metrics go into the last StepReport (replacing those of
a pass the last step itself ran). A pass is skipped when the store already
holds ``val/reward/mean`` at its step: a resumed run does not repeat it.
Validation rollouts have ``step`` None and group ids ``val-s<step>-t<i>``:
no step's batch and no resume plan ever contains them.

Diagnostics: the ``DiagnosticsMonitor`` observes each step's metrics (with
its validation metrics) and the final pass; each new finding is logged by
the monitor (``diagnostics.jsonl``, MLflow) and listed in the StepReport's
``warnings``, which the progress display prints.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from ..algorithms import AdvantageParams
from ..config import MtrlConfig
from ..diagnostics import TEMPLATE_DRIFT, VAL_REWARD, ZERO_ADV
from ..evaluation import StrictScorer, run_validation
from ..monitor import StepObserver
from ..rollouts import Dispatcher, StepBatch, TaskSchedule
from ..torch_support import on_own_thread
from ..tracking import NullTracker
from ..tripwires import TripwireStop
from ..types import MeasuresTemplateDrift, RecordsTrips, RunTracker, Task
from ._batch import PreparedBatch
from ._checkpoint import Checkpoints
from ._dynamic_sampling import SampledStep, sample_step
from ._metrics import onset_suspects, rollout_metrics
from ._resume import ResumePlan
from ._roles import RoleUpdates, prepare_step_batch
from ._weights import WeightSync
from .distributed import ShardedUpdate
from .update import PolicyUpdate

log = logging.getLogger("mtrl.train")


@dataclass(frozen=True)
class StepReport:
    """What one step did, for progress displays and callers of ``train()``.

    ``metrics`` holds the step's ``val/...`` metrics when a validation pass ran
    with it (the last report: the pass after the last step). ``warnings``:
    environment problems and the diagnostics that fired at this step.
    """

    step: int
    max_steps: int
    metrics: dict[str, float]
    warnings: tuple[str, ...] = ()
    checkpoint: str | None = None


@dataclass(frozen=True)
class ValidationPass:
    """One validation pass as the loop logs it: ``val/...`` metrics and the rollouts to name if hacked."""

    step: int
    metrics: dict[str, float]
    suspects: tuple[str, ...] = ()  # reward-only disagreements with the strict scorer


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
    weights: WeightSync
    checkpoints: Checkpoints
    tracker: RunTracker = field(default_factory=NullTracker)
    resume: ResumePlan | None = None
    on_step: Callable[[StepReport], bool | None] | None = None  # returning True ends the run after that step
    extra_state: dict[str, Any] = field(default_factory=dict)
    validation_tasks: Sequence[Task] = ()
    strict_scorer: StrictScorer | None = None
    monitor: StepObserver | None = None  # monitor.DiagnosticsMonitor

    @property
    def update(self) -> PolicyUpdate | ShardedUpdate | RoleUpdates:
        return self.weights.update

    @property
    def validates(self) -> bool:
        return bool(self.validation_tasks) and self.config.core.val_every > 0

    def validates_at(self, step: int) -> bool:
        """Whether a trained step ``step`` starts with a validation pass (step 0 and every ``val_every``)."""
        return self.validates and step % self.config.core.val_every == 0

    async def run(self, start: int) -> list[StepReport]:
        max_steps = self.config.core.max_steps
        bound = off_policy_bound(self.config)
        pending: dict[int, asyncio.Task[SampledStep]] = {}
        reports = []
        last_end = time.perf_counter()
        try:
            for step in range(start, max_steps):
                for ahead in range(step, min(step + bound, max_steps - 1) + 1):
                    if ahead not in pending:
                        pending[ahead] = asyncio.create_task(self._collect(ahead), name=f"mtrl-collect-{ahead}")
                validated = await self._validate(step) if self.validates_at(step) else None  # while step collects
                waited = time.perf_counter()
                sampled = await pending[step]  # left in `pending` until done: a stop cancels and awaits it below
                del pending[step]
                waited = time.perf_counter() - waited
                report = await self._train(sampled, bound, waited, last_end, validated)
                last_end = time.perf_counter()
                last = step == max_steps - 1
                if last:
                    report = await self._final_validation(report)
                reports.append(report)
                if self.on_step is not None and self.on_step(report):
                    if report.checkpoint is None:  # stopping early: commit what was trained
                        await self._checkpoint(step + 1)
                    if not last:
                        reports[-1] = await self._final_validation(report)
                    break
        finally:
            for task in pending.values():
                task.cancel()
            await asyncio.gather(*pending.values(), return_exceptions=True)
        return reports

    async def _collect(self, step: int) -> SampledStep:
        reuse = self.resume.for_step(step) if self.resume is not None else None
        return await sample_step(self.dispatcher, self.schedule, step, self.config, reuse)

    async def _validate(self, step: int) -> ValidationPass | None:
        """Run the validation pass at ``step`` on the served policy; None when the store already has it."""
        if await asyncio.to_thread(self._validated_before, step):
            return None
        started = time.perf_counter()
        side = await run_validation(self.dispatcher, self.validation_tasks, step=step, strict_scorer=self.strict_scorer)
        self.tracker.log_rollouts(side.rollouts, step)
        suspects = tuple(d.rollout_id for d in side.strict.reward_only) if side.strict is not None else ()
        return ValidationPass(step, {**side.metrics, "time/validation": time.perf_counter() - started}, suspects)

    def _validated_before(self, step: int) -> bool:
        return any(s == step for s, _, _ in self.checkpoints.store.metric_history(VAL_REWARD))

    async def _final_validation(self, report: StepReport) -> StepReport:
        """The pass after the last trained step, once its checkpoint exists; merged into ``report``."""
        step = report.step + 1
        validated = await self._validate(step) if self.validates else None
        if validated is None:
            return report
        self.tracker.log_metrics(step, validated.metrics)
        await asyncio.to_thread(self.checkpoints.store.log_metrics, step, validated.metrics)  # its policy is saved
        found = self._diagnose(step, validated.metrics, validated.suspects)
        return replace(report, metrics={**report.metrics, **validated.metrics}, warnings=report.warnings + found)

    def _stop_on_trips(self, step: int, tripped: Sequence[str], total: int) -> None:
        """``advanced.tripwires.stop_rate``: a step with a larger share of tripped rollouts stops the run, with the evidence."""
        limit = self.config.advanced.tripwires.stop_rate
        if limit is None or not total or len(tripped) / total <= limit:
            return
        coordinator = self.dispatcher.coordinator
        evidence = [(rid, coordinator.tripwire_trips(rid) if isinstance(coordinator, RecordsTrips) else ())
                    for rid in tripped]
        raise TripwireStop(step, len(tripped), total, limit, evidence, self.config.run_folder.tripwires)

    def _diagnose(
        self, step: int, metrics: Mapping[str, float], suspects: Sequence[str] = (),
        named: Mapping[str, Sequence[str]] | None = None,
    ) -> tuple[str, ...]:
        """The monitor's new findings at ``step`` (it logs them) as warning lines."""
        if self.monitor is None:
            return ()
        lines = tuple(f"diagnosis at step {step}: {d}" for d in self.monitor.observe(step, metrics, suspects, named))
        for line in lines:
            log.info("mtrl: %s", line)
        return lines

    async def _train(
        self, sampled: SampledStep, bound: int, waited: float, last_end: float, validated: ValidationPass | None = None
    ) -> StepReport:
        core, batch = self.config.core, sampled.batch
        params = AdvantageParams(success_threshold=core.success_threshold)
        prepared = self._prepared(batch, params, bound)
        started = time.perf_counter()
        if prepared.samples:
            update_metrics = await self.weights.apply(prepared.samples)
        else:  # nothing carries signal (e.g. every group had equal rewards): no update this step
            update_metrics = {"train/skipped": 1.0, "train/policy_version": float(self.update.version)}
        now = time.perf_counter()
        metrics = rollout_metrics(batch.rollouts)
        coordinator = self.dispatcher.coordinator
        if isinstance(coordinator, MeasuresTemplateDrift):  # trained tokens unlike what deployment renders
            metrics[TEMPLATE_DRIFT] = await asyncio.to_thread(coordinator.template_drift, batch.rollouts)
        metrics.update(batch.failure_metrics())
        metrics.update(prepared.metrics)
        groups = sum(1 for g in batch.groups if g.kept)  # the groups advantages were computed over
        metrics[ZERO_ADV] = metrics["analysis/zero_adv_groups"] / groups if groups else 0.0
        metrics.update(sampled.metrics)
        metrics.update(update_metrics)
        metrics.update({
            "time/rollout": batch.seconds,
            "time/rollout_wait": waited,
            "time/update": now - started,
            "time/step": now - last_end,
            "rollout/first_policy_version": float(batch.first_version),
        })
        if validated is not None:
            metrics.update(validated.metrics)
        tripped = [r.id for r in batch.rollouts if r.metrics.get("tripwire_tripped")]
        named = {"tripped": tripped, "onset": onset_suspects(batch.rollouts)}
        found = self._diagnose(batch.step, metrics, validated.suspects if validated is not None else (), named)
        self.tracker.log_metrics(batch.step, metrics)
        self.tracker.log_rollouts(batch.rollouts, batch.step)
        self.checkpoints.record(batch.step, prepared.rollout_ids, metrics)
        self._stop_on_trips(batch.step, tripped, len(batch.rollouts))
        saved = await self._maybe_checkpoint(batch.step + 1)
        return StepReport(batch.step, core.max_steps, metrics, batch.warnings + found, saved)

    def _prepared(self, batch: StepBatch, params: AdvantageParams, bound: int) -> PreparedBatch:
        """The step's samples: of the one policy, or of each role the schedule trains now (``roles``)."""
        return prepare_step_batch(self.config, batch.groups, batch.step, self.config.core.advantage_method, params,
                                  int(self.update.version), bound)

    async def _maybe_checkpoint(self, next_step: int) -> str | None:
        every = self.config.advanced.checkpoint_every
        due = next_step == self.config.core.max_steps or (every > 0 and next_step % every == 0)
        return await self._checkpoint(next_step) if due else None

    async def _checkpoint(self, next_step: int) -> str:
        folder = await on_own_thread(  # torch work off the run's torch thread: torch_support
            self.checkpoints.save, next_step, self.update, self.schedule.position(next_step), self.extra_state
        )
        return str(folder)


__all__ = ["StepReport", "TrainingLoop", "off_policy_bound"]
