"""What one step's update would see under a reward: reward distribution, advantages, the per-token signal.

``step_signal`` runs the trainer's own batch preparation
(``training.prepare_batch``: advantages over the kept groups, groups whose
advantages are all zero excluded, sequence extension, the staleness filter)
on a step's groups, with each rollout's reward taken from ``rewards`` (the
stored reward when absent), and measures:

- the loop's own step metrics (``training.rollout_metrics``: ``rollout/reward/mean``,
  ``rollout/reward/zero_frac``, the reward function's ``rollout/metrics/<name>``...)
  and the reward distribution over every rollout of the step (sample std, quantiles);
- ``analysis/equal_reward_groups``, ``analysis/zero_adv_groups`` and the
  zero-advantage share of the kept groups (``analysis/zero_adv_frac``);
- the per-token signal: over the tokens the update trains (loss mask, from
  a sample's second token on, as ``train/tokens_trained`` counts them) the
  sum and mean of ``|advantage|``, and the share of the step's generated
  tokens (kept groups) that carry a nonzero advantage.

No torch: samples are token ids, masks and advantages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ..algorithms import AdvantageParams
from ..diagnostics import ZERO_ADV
from ..rollouts import GroupResult
from ..training import prepare_batch, prepare_step_batch, rollout_metrics
from ..types import ROLE_REWARD_PREFIX, Rollout

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


@dataclass(frozen=True)
class StepSignal:
    """One step under one reward and advantage method (see the module docstring)."""

    step: int
    rewards: tuple[float, ...]  # every rollout of the step, batch order
    metrics: Mapping[str, float]  # the loop's names: rollout/reward/mean, analysis/..., advantages/..., samples/...
    trained_ids: frozenset[str]
    tokens_generated: int  # completion tokens of the kept groups' rollouts
    tokens_trained: int  # loss-mask tokens past each sample's first, as the update counts them
    tokens_signal: int  # trained tokens whose advantage is nonzero
    abs_adv_sum: float  # sum of |advantage| over the trained tokens

    @property
    def signal_frac(self) -> float:
        """Generated tokens (kept groups) that carry a nonzero advantage into the update."""
        return self.tokens_signal / self.tokens_generated if self.tokens_generated else 0.0

    @property
    def abs_adv_per_token(self) -> float:
        return self.abs_adv_sum / self.tokens_trained if self.tokens_trained else 0.0

    def summary(self) -> dict[str, float]:
        """Every figure of the step as one flat dict (report rows, JSON)."""
        out = dict(self.metrics)
        out.update(reward_distribution(self.rewards))
        out.update({
            "signal/tokens_generated": float(self.tokens_generated),
            "signal/tokens_trained": float(self.tokens_trained),
            "signal/tokens_nonzero_adv": float(self.tokens_signal),
            "signal/nonzero_adv_frac": self.signal_frac,
            "signal/abs_adv_sum": self.abs_adv_sum,
            "signal/abs_adv_per_token": self.abs_adv_per_token,
        })
        return out


def with_rewards(rollout: Rollout, rewards: Mapping[str, tuple[float, Mapping[str, float]]]) -> Rollout:
    """``rollout`` with its reward (and reward metrics) replaced when ``rewards`` holds one for it. Each role's own
    reward (``role_reward/<role>``, ``Rollout.role_rewards``) stays as recorded unless the new metrics name it."""
    if rollout.id not in rewards:
        return rollout
    reward, metrics = rewards[rollout.id]
    kept = {name: value for name, value in rollout.metrics.items() if name.startswith(ROLE_REWARD_PREFIX)}
    return replace(rollout, reward=reward, turn_rewards=None, reward_defaulted=False, metrics={**kept, **metrics})


def step_signal(
    step: int,
    groups: Sequence[GroupResult],
    method: str,
    params: AdvantageParams,
    version: int,
    max_off_policy: int,
    options: Mapping[str, bool] | None = None,
    *,
    config: Any = None,
) -> StepSignal:
    """The figures of one step's groups (already carrying the rewards to measure) under ``method``. ``config``: the
    run's, so that the batch is prepared as its loop prepared it (``training.prepare_step_batch``: its options, and
    each role's samples in a run with roles); without one, ``options`` (``training.batch_options``) for one policy."""
    if config is not None:
        prepared = prepare_step_batch(config, groups, step, method, params, version, max_off_policy)
    else:
        prepared = prepare_batch(groups, method, params, version, max_off_policy, **(options or {}))
    rollouts = [r for g in groups for r in g.finished]
    rewards = tuple(r.total_reward for r in rollouts)
    kept_groups = sum(1 for g in groups if g.kept)
    metrics = rollout_metrics(rollouts)  # as the loop composes a step's metrics
    metrics.update(prepared.metrics)
    metrics[ZERO_ADV] = metrics["analysis/zero_adv_groups"] / kept_groups if kept_groups else 0.0
    trained = signal = 0
    abs_sum = 0.0
    for sample in prepared.samples:
        for mask, adv in zip(sample.loss_mask_T[1:], sample.advantages_T[1:]):
            if mask:
                trained += 1
                signal += adv != 0.0
                abs_sum += abs(adv)
    generated = sum(len(t.completion_ids) for g in groups for r in g.kept for t in r.turns)
    return StepSignal(step, rewards, metrics, frozenset(prepared.rollout_ids), generated, trained, signal, abs_sum)


def reward_distribution(rewards: Sequence[float]) -> dict[str, float]:
    """Mean, sample std, min, max and quantiles (linear interpolation) of ``rewards``."""
    xs = sorted(rewards)
    out = {"reward/count": float(len(xs)), "reward/mean": _mean(xs), "reward/std": _std(xs),
           "reward/min": xs[0] if xs else 0.0, "reward/max": xs[-1] if xs else 0.0}
    for q in QUANTILES:
        out[f"reward/p{round(q * 100):02d}"] = _quantile(xs, q)
    return out


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    if not sorted_xs:
        return 0.0
    pos = q * (len(sorted_xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


__all__ = ["QUANTILES", "StepSignal", "reward_distribution", "step_signal", "with_rewards"]
