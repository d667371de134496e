"""One evaluation pass: k samples of each task through the dispatcher, with fixed seeds, summarized.

The pass reuses the training dispatcher (concurrency limit, timeouts,
recording), with a copy of the config that samples ``val_sampling_params``
(or the sampling it is given), runs ``k`` rollouts per task (one group of
``k``) and never retries a failed rollout: a failure is an outcome to
count, not to hide. Sample ``j`` of task ``t`` always gets the seed
``sample_seed(seed, t, j)``, so the base model and the fine-tuned adapter
see the same tasks with the same seeds, and so does every validation pass
of a run.

Evaluation rollouts are recorded with ``step`` None and group ids
``<prefix>-t<index>``: they belong to no training batch, so a resumed run
never trains on them. A side run on a reference model (``model`` given:
the coordinator passes its calls to the reference's endpoint) is the same
pass; its turns carry the model's name and no token ids, so it has no
template-drift figure.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ..config import MtrlConfig, SamplingConfig
from ..diagnostics import BASE_SUCCESS
from ..rollouts import Dispatcher, load_tasks
from ..seeds import derived_seed
from ..types import MeasuresTemplateDrift, Rollout, Task
from ._metrics import EvalRecord, eval_metrics, success_rate
from ._records import record_of
from ._strict import StrictComparison, StrictScorer, compare_with_strict


FINE_TUNED = "fine_tuned"
BASE = "base"
REFERENCE = "reference"  # a reference model behind its own endpoint (``coordinator.ReferenceModel``)


def sample_seed(seed: int, task_id: str, index: int) -> int:
    """The seed of sample ``index`` of task ``task_id``: stable across runs, processes and machines."""
    return derived_seed(seed, task_id, index)


@dataclass(frozen=True)
class EvalPlan:
    """Which tasks, how many samples of each (k), with which sampling and seeds, scored how."""

    tasks: tuple[Task, ...]
    samples: int
    sampling: SamplingConfig
    seed: int = 0
    pass_k_values: tuple[int, ...] = (1,)
    success_threshold: float = 1.0

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("tasks: an evaluation needs at least one task")
        if self.samples < 1:
            raise ValueError(f"samples: must be >= 1 per task, got {self.samples}")
        ids = [t.id for t in self.tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("tasks: task ids must be unique in an evaluation")

    @classmethod
    def from_config(
        cls,
        config: MtrlConfig,
        tasks: Sequence[Task],
        *,
        max_samples: int | None = None,
        samples: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> "EvalPlan":
        """k = ``samples``, else max(pass_k_values) capped at ``max_samples``; sampling = val_sampling_params."""
        core = config.core
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples: must be >= 1, got {max_samples}")
        k = samples if samples is not None else max(core.pass_k_values)
        if max_samples is not None:
            k = min(k, max_samples)
        return cls(
            tasks=tuple(tasks),
            samples=k,
            sampling=(sampling or core.val_sampling_params).model_copy(),
            seed=core.seed,
            pass_k_values=tuple(core.pass_k_values),
            success_threshold=core.success_threshold,
        )

    def seed_for(self, task_id: str, index: int) -> int:
        return sample_seed(self.seed, task_id, index)

    def rollout_seed(self, task: Task, group_id: str, serial: int) -> int:
        """The dispatcher's seed plan: the ``serial``-th rollout of a task's group is its sample ``serial``
        (an evaluation never retries, so a group's serials are its samples 0..k-1)."""
        return self.seed_for(task.id, serial)

    @property
    def task_map(self) -> dict[str, Task]:
        return {t.id: t for t in self.tasks}

    def dispatch_config(self, config: MtrlConfig) -> MtrlConfig:
        """The config the dispatcher runs this plan with: k per group, this sampling, no retries."""
        return config.with_overrides({
            "core.group_size": self.samples,
            "core.sampling_params": self.sampling.model_dump(),
            "advanced.group_policy.on_failure": "keep_survivors",
            "advanced.group_policy.min_survivors": 1,
        })


def select_tasks(dataset: Any, split: str | None = None, max_tasks: int | None = None) -> list[Task]:
    """Tasks of ``dataset`` (JSONL path or rows) with ``split``, the first ``max_tasks`` in file order."""
    if max_tasks is not None and max_tasks < 1:
        raise ValueError(f"max_tasks: must be >= 1, got {max_tasks}")
    tasks = load_tasks(dataset)
    if split is not None:
        tasks = [t for t in tasks if t.split == split]
        if not tasks:
            raise ValueError(f"split: no task of the dataset has split {split!r}")
    return tasks[:max_tasks] if max_tasks is not None else tasks


def run_tag() -> str:
    """A group-id prefix unique to one evaluation: its start time and a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class EvalSide:
    """One model's evaluation: its rollouts, their records, the metrics and the strict comparison."""

    label: str
    rollouts: tuple[Rollout, ...]
    records: tuple[EvalRecord, ...]
    metrics: Mapping[str, float]
    strict: StrictComparison | None = None
    policy_version: int = 0
    model: str | None = None  # the reference model that answered (None: the policy the engine served)


def summarize(
    label: str,
    rollouts: Sequence[Rollout],
    plan: EvalPlan,
    scorer: StrictScorer | None = None,
    *,
    prefix: str = "val",
    policy_version: int = 0,
) -> EvalSide:
    """Records, metrics (``<prefix>/reward/mean``, pass@k, ...) and the strict comparison of ``rollouts``."""
    records = tuple(record_of(r, plan.success_threshold) for r in rollouts)
    metrics = eval_metrics(records, plan.pass_k_values, prefix=prefix)
    strict = None
    if scorer is not None:
        strict = compare_with_strict(rollouts, plan.task_map, scorer, plan.success_threshold)
        metrics.update(strict.metrics(plan.pass_k_values, prefix=prefix))
    return EvalSide(label, tuple(rollouts), records, metrics, strict, policy_version)


async def run_side(
    dispatcher: Dispatcher,
    plan: EvalPlan,
    *,
    label: str,
    group_prefix: str,
    scorer: StrictScorer | None = None,
    prefix: str = "val",
    model: str | None = None,
    base_model: bool = False,
) -> EvalSide:
    """Run every task of ``plan`` k times on the policy served now and summarize the rollouts.

    ``dispatcher`` is any dispatcher over the coordinator to evaluate on (its
    executor runs the agent); the plan's sampling, seeds and k replace its own,
    and the side gets a concurrency limit of its own.
    ``model``: the reference model the coordinator passes these rollouts' calls to (see the module docstring).
    ``base_model``: the rollouts are answered by the base model, its adapter switched off for their rows only
    (the engine mixes them with the fine-tuned side's, ``types.MixesBaseRows``).
    """
    version = 0 if base_model else int(dispatcher.coordinator.policy_version)
    seeded = dispatcher.with_plan(plan.dispatch_config(dispatcher.config), dispatcher.executor,
                                  base_model=base_model, seeds=plan.rollout_seed)
    groups = await asyncio.gather(
        *(seeded.run_group(f"{group_prefix}-t{i}", task) for i, task in enumerate(plan.tasks))
    )
    rollouts = [r for g in groups for r in g.finished]
    side = replace(summarize(label, rollouts, plan, scorer, prefix=prefix, policy_version=version), model=model)
    coordinator = dispatcher.coordinator
    # the training loop's figure, on these rollouts (a reference model's have no ids to compare)
    if model is None and isinstance(coordinator, MeasuresTemplateDrift):
        drift = await asyncio.to_thread(coordinator.template_drift, rollouts)
        side = replace(side, metrics={**side.metrics, f"{prefix}/template_drift_frac": drift})
    return side


async def run_validation(
    dispatcher: Dispatcher,
    tasks: Sequence[Task],
    *,
    step: int,
    strict_scorer: StrictScorer | None = None,
    max_samples: int | None = None,
) -> EvalSide:
    """The trainer's validation pass at ``step``: log ``side.metrics`` (``val/...``) at that step.

    Runs on the trainer's own coordinator, engine and executor, with the
    policy the engine serves now. Before the first update (policy version 0)
    the metrics also hold ``val/reward/base_success``, which the diagnostics
    rule ``base_zero_success`` reads: the strict scorer's success rate when
    there is one (the independent judge of "solved"), else the reward's.
    """
    plan = EvalPlan.from_config(dispatcher.config, tasks, max_samples=max_samples)
    side = await run_side(dispatcher, plan, label="policy", group_prefix=f"val-s{step}", scorer=strict_scorer)
    if side.policy_version == 0:
        base = side.strict.success_rate if side.strict is not None else success_rate(side.records)
        side = replace(side, metrics={**side.metrics, BASE_SUCCESS: base})
    return side


__all__ = [
    "BASE",
    "BASE_SUCCESS",
    "FINE_TUNED",
    "REFERENCE",
    "EvalPlan",
    "EvalSide",
    "run_side",
    "run_tag",
    "run_validation",
    "sample_seed",
    "select_tasks",
    "summarize",
]
