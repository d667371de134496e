"""Dynamic sampling (DAPO-style refill): a step's batch made up to ``train_batch_size`` groups with signal.

A group is *useful* when the group policy kept it and the configured
advantage method gives it a non-zero advantage: the rule the update uses
to train on it (``_batch.group_advantages``; for the group-relative methods,
rewards not all equal). With ``advanced.dynamic_sampling.enabled``, once the
step's ``B = train_batch_size`` groups are back, the step draws ``B - useful``
extra tasks, runs their groups, and repeats (rounds) until ``B`` groups are
useful or it has drawn ``max_extra_groups`` extra groups (default ``B``).

Deterministic, so a resumed run redoes what the crashed one did:

- the k-th extra task of step ``t`` is ``TaskSchedule.refill(t, k, 1)``, a
  stream of its own, a pure function of (seed, t, k): rewards decide how
  many are drawn, never which, and which group finished first decides
  nothing (a round waits for all its groups);
- its group id is ``s<t>-r<k>`` (``refill_group_id``), so the resume plan
  puts the crashed run's completed rollouts of it back, as for the step's
  own groups; with the same rewards the resumed run draws the same tasks,
  in the same order;
- the main data position (``TaskSchedule.position``, saved in every
  checkpoint) does not move: step ``t + 1``'s batch never depends on how
  many tasks step ``t`` drew, so an async run collects step ``t + 1`` while
  step ``t`` refills or trains (its extra rollouts start no earlier than its
  own, so they are never staler than the bound).

Nothing is thrown away here: every group that ran is in the step's batch;
the update excludes the ones without signal as before (counted in
``analysis/zero_adv_groups``), and their rollouts count in the rollout
metrics. Logged every step, whether refill is on or off (see
``sampling_metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ..algorithms import AdvantageParams
from ..config import MtrlConfig
from ..roles import role_view
from ..rollouts import Dispatcher, GroupResult, StepBatch, TaskSchedule, refill_group_id
from ..types import Rollout
from ._batch import group_advantages

USEFUL = "analysis/useful_groups"
REFILLED = "analysis/refilled_groups"
ROLLOUTS_PER_USEFUL = "analysis/rollouts_per_useful_group"


@dataclass(frozen=True)
class SampledStep:
    """A step's batch (its own groups, then the extra ones) and what sampling it took."""

    batch: StepBatch
    metrics: dict[str, float]


def useful_mask(groups: Sequence[GroupResult], config: MtrlConfig) -> list[bool]:
    """Per group: does the update train on it (kept by the group policy, some advantage non-zero)? With roles:
    some role's view of it (``roles.role_view``: its turns, its own rewards) carries a non-zero advantage."""
    core = config.core
    params = AdvantageParams(success_threshold=core.success_threshold)
    roles = config.advanced.role_map
    views = [list(groups)] if roles is None else [
        [replace(g, kept=tuple(role_view(r, role) for r in g.kept)) for g in groups] for role in roles.roles]
    useful = [False] * len(groups)
    for seen in views:
        kept, advantages, _ = group_advantages(seen, core.advantage_method, params)
        signal = {id(g) for g, adv in zip(kept, advantages) if adv is not None}
        useful = [was or id(g) in signal for was, g in zip(useful, seen)]
    return useful


def extra_group_bound(config: MtrlConfig) -> int:
    """How many extra groups one step may draw: 0 when refill is off."""
    settings = config.advanced.dynamic_sampling
    if not settings.enabled:
        return 0
    return settings.max_extra_groups if settings.max_extra_groups is not None else config.core.train_batch_size


async def sample_step(
    dispatcher: Dispatcher,
    schedule: TaskSchedule,
    step: int,
    config: MtrlConfig,
    reuse: Mapping[str, Sequence[Rollout]] | None = None,
) -> SampledStep:
    """Collect step ``step``'s groups, then refill rounds while groups without signal leave it short."""
    batch = await dispatcher.collect(step, schedule.batch(step), reuse)
    target, bound = schedule.batch_size, extra_group_bound(config)
    drawn = rounds = 0
    useful_G = useful_mask(batch.groups, config)
    while sum(useful_G) < target and drawn < bound:
        n = min(target - sum(useful_G), bound - drawn)
        ids = [refill_group_id(step, k) for k in range(drawn, drawn + n)]
        more = await dispatcher.collect(step, schedule.refill(step, drawn, n), reuse, group_ids=ids)
        batch = batch.extended(more)
        drawn, rounds = drawn + n, rounds + 1
        useful_G = useful_mask(batch.groups, config)
    return SampledStep(batch, sampling_metrics(batch, useful_G, target, drawn, rounds))


def sampling_metrics(batch: StepBatch, useful_G: Sequence[bool], target: int, extra: int, rounds: int) -> dict[str, float]:
    """What a step's batch cost in rollouts per group that carried signal.

    ``useful_G[g]``: group g trains; the last ``extra`` groups are the refill's.
    ``analysis/rollouts_per_useful_group`` (every rollout that ended in the
    step, failed, retried and reused ones included, over the useful groups)
    is left out of a step with no useful group.
    """
    useful = sum(useful_G)
    spent = len(batch.rollouts)
    metrics = {
        USEFUL: float(useful),
        REFILLED: float(extra),
        "analysis/refill_rounds": float(rounds),
        "analysis/refill_groups_dropped": float(sum(not u for u in useful_G[len(useful_G) - extra:])) if extra else 0.0,
        "analysis/useful_groups_short": float(max(target - useful, 0)),
        "analysis/rollouts_spent": float(spent),
    }
    if useful:
        metrics[ROLLOUTS_PER_USEFUL] = spent / useful
    return metrics


__all__ = ["REFILLED", "ROLLOUTS_PER_USEFUL", "SampledStep", "USEFUL", "extra_group_bound", "sample_step",
           "sampling_metrics", "useful_mask"]
