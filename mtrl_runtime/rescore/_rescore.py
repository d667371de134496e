"""``rescore_run``: a run's stored rollouts under another reward (and advantage method), side by side.

Per step, two ``StepSignal``s over the same groups: ``original`` (the stored
rewards, the run's ``advantage_method``) and ``rescored`` (the new reward on
every completed rollout, ``method`` or the run's). A rollout that did not
complete keeps the reward the run gave it (the agent never scored it: the
configured default) and is counted. ``original`` is checked against what
the run logged (``REPRODUCED``) and against the rollouts the store marks
trained; any difference is listed, never smoothed over: it means the batch
was rebuilt wrongly (a resumed step, an edited store) and the comparison
would mislead.

A run with roles is rebuilt as its loop trained it: each role's samples
from its own view of the groups (``training.prepare_step_batch``). The new
reward replaces the episode's; a role the agent rewarded apart
(``role_rewards``) keeps its recorded reward on both sides.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from ..algorithms import ADVANTAGES, AdvantageParams
from ..config import REWARD_LIMIT
from ..evaluation import StrictComparison, StrictScorer, compare_with_strict, final_text
from ..rewards import Trajectory, score_trajectory, trajectory_of
from ..rollouts import GroupResult
from ..types import Rollout, RolloutStatus, Task
from ._run import StoredRun, StoredStep
from ._signal import StepSignal, step_signal, with_rewards

# what the loop logged that the original side must reproduce (train/tokens_trained when the update ran)
REPRODUCED = (
    "rollout/reward/mean",
    "rollout/reward/zero_frac",
    "analysis/equal_reward_groups",
    "analysis/zero_adv_groups",
    "analysis/zero_adv_frac",
    "advantages/mean",
    "advantages/abs_mean",
    "advantages/min",
    "advantages/max",
    "samples/count",
)
TOKENS_TRAINED = "train/tokens_trained"
REL_TOL = 1e-9  # float sums in another order; anything larger is a different batch


class RescoreError(RuntimeError):
    """A reward function failed on a stored rollout; the message names the rollout and the task."""


@dataclass(frozen=True)
class Mismatch:
    """A figure the original side recomputed differently from what the run logged."""

    step: int
    name: str
    logged: Any
    recomputed: Any

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "name": self.name, "logged": self.logged, "recomputed": self.recomputed}


@dataclass(frozen=True)
class RewardChange:
    """A completed rollout whose reward the new function scores differently."""

    rollout_id: str
    task_id: str
    group_id: str
    original: float
    rescored: float
    final_answer: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepComparison:
    """One step, original vs rescored, with what the run logged and the strict scorer's view of both."""

    step: int
    original: StepSignal
    rescored: StepSignal
    logged: Mapping[str, float]
    mismatches: tuple[Mismatch, ...] = ()
    changes: tuple[RewardChange, ...] = ()
    kept_recorded: int = 0  # rollouts that did not complete: their recorded reward stands
    strict_original: StrictComparison | None = None
    strict_rescored: StrictComparison | None = None


@dataclass(frozen=True)
class RescoreResult:
    """What ``rescore_run`` found (``reproduced``: the original side equals what the run logged)."""

    run: StoredRun
    reward: str
    original_method: str
    method: str
    params: AdvantageParams
    strict: str | None
    steps: tuple[StepComparison, ...] = field(default_factory=tuple)

    @property
    def mismatches(self) -> list[Mismatch]:
        return [m for s in self.steps for m in s.mismatches]

    @property
    def reproduced(self) -> bool:
        return not self.mismatches


def rescore_run(
    run: StoredRun,
    reward_fn: Callable[[Trajectory], Any],
    reward_name: str = "reward",
    method: str | None = None,
    strict: StrictScorer | None = None,
) -> RescoreResult:
    """Score every stored step's rollouts with ``reward_fn`` and compare with what the run used."""
    core = run.config.core
    original_method = core.advantage_method
    method = method or original_method
    if method not in ADVANTAGES:
        raise ValueError(f"--advantage: unknown advantage method {method!r}; known: {', '.join(ADVANTAGES.names())}")
    params = AdvantageParams(success_threshold=core.success_threshold)
    bound = off_policy_bound(run)
    steps = []
    for stored in run.steps:
        scores = score_rollouts(stored.rollouts, run.tasks, reward_fn, reward_name)
        rescored_groups = [_regroup(g, scores) for g in stored.groups]
        version = stored.policy_version
        original = step_signal(stored.step, stored.groups, original_method, params, version, bound, config=run.config)
        rescored = step_signal(stored.step, rescored_groups, method, params, version, bound, config=run.config)
        strict_pair = (None, None)
        if strict is not None:
            new_rollouts = [r for g in rescored_groups for r in g.finished]
            strict_pair = (compare_with_strict(stored.rollouts, run.tasks, strict, core.success_threshold),
                           compare_with_strict(new_rollouts, run.tasks, strict, core.success_threshold))
        steps.append(StepComparison(
            step=stored.step, original=original, rescored=rescored, logged=dict(stored.logged),
            mismatches=tuple(check_reproduced(stored, original)), changes=tuple(_changes(stored.rollouts, scores)),
            kept_recorded=sum(1 for r in stored.rollouts if r.id not in scores),
            strict_original=strict_pair[0], strict_rescored=strict_pair[1],
        ))
    return RescoreResult(run, reward_name, original_method, method, params,
                         strict.name if strict is not None else None, tuple(steps))


def off_policy_bound(run: StoredRun) -> int:
    """The staleness bound the run's sample filter used: 0 unless it trained asynchronously."""
    async_cfg = run.config.advanced.async_config
    return async_cfg.max_steps_off_policy if async_cfg.enabled else 0


def score_rollouts(
    rollouts: Sequence[Rollout], tasks: Mapping[str, Task], fn: Callable[[Trajectory], Any], name: str
) -> dict[str, tuple[float, dict[str, float]]]:
    """``fn``'s reward and metrics of every completed rollout; an error names the rollout and its task."""
    scores = {}
    for rollout in rollouts:
        if rollout.status is not RolloutStatus.COMPLETED:
            continue
        reward, metrics = score_trajectory(_guarded(fn, name, rollout), trajectory_of(rollout, tasks[rollout.task_id]),
                                           name)
        if abs(reward) > REWARD_LIMIT:
            raise ValueError(f"{name} returned {reward!r} for rollout {rollout.id!r}; "
                             f"rewards are bounded by +-{REWARD_LIMIT:g}")
        scores[rollout.id] = (reward, metrics)
    return scores


def _guarded(fn: Callable[[Trajectory], Any], name: str, rollout: Rollout) -> Callable[[Trajectory], Any]:
    """``fn``, its exceptions re-raised naming the rollout it failed on."""

    def call(trajectory: Trajectory) -> Any:
        try:
            return fn(trajectory)
        except Exception as exc:
            raise RescoreError(f"reward {name} raised {type(exc).__name__}: {exc} on rollout {rollout.id!r} "
                               f"(task {rollout.task_id!r}, step {rollout.step})") from exc

    return call


def check_reproduced(stored: StoredStep, original: StepSignal) -> list[Mismatch]:
    """Where the original side differs from the step's logged metrics and trained rollouts (none: reproduced)."""
    if not stored.logged:  # never committed (trained after the last checkpoint, or not trained): nothing to check
        return []
    found = []
    recomputed = dict(original.metrics)
    names = list(REPRODUCED)
    if TOKENS_TRAINED in stored.logged and not stored.logged.get("train/skipped"):
        recomputed[TOKENS_TRAINED] = float(original.tokens_trained)
        names.append(TOKENS_TRAINED)
    for name in names:
        logged, value = stored.logged.get(name), recomputed.get(name)
        if logged is None or value is None:
            if logged is not None or value is not None:
                found.append(Mismatch(stored.step, name, logged, value))
            continue
        if not math.isclose(logged, value, rel_tol=REL_TOL, abs_tol=REL_TOL):
            found.append(Mismatch(stored.step, name, logged, value))
    if stored.trained_ids != original.trained_ids:
        found.append(Mismatch(stored.step, "trained rollouts", sorted(stored.trained_ids),
                              sorted(original.trained_ids)))
    return found


def _regroup(group: GroupResult, scores: Mapping[str, tuple[float, dict[str, float]]]) -> GroupResult:
    return replace(group, kept=tuple(with_rewards(r, scores) for r in group.kept),
                   finished=tuple(with_rewards(r, scores) for r in group.finished))


def _changes(rollouts: Sequence[Rollout], scores: Mapping[str, tuple[float, dict[str, float]]]) -> list[RewardChange]:
    return [RewardChange(r.id, r.task_id, r.group_id, r.total_reward, scores[r.id][0], final_text(r))
            for r in rollouts if r.id in scores and scores[r.id][0] != r.total_reward]
