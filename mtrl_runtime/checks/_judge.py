"""``mtrl check reward --judge``: is a group judge fit to train on, audited on baseline rollouts?

Every group of completed baseline rollouts is judged in ``orders`` orders
(as recorded, reversed, then seeded shuffles). The scores of the recorded
order (the one training sends) are compared with a reference: the strict
scorer when one is given, else the agent's own reward. Checks:

- order agreement: of the pairs of one group the reference tells apart, the
  share the judge orders the same way (a judge tie counts half);
- success agreement: the share of rollouts where judge score >= the success
  threshold exactly when the reference says success;
- position bias: the correlation of a trajectory's score (less its mean over
  all orders) with its position in the prompt, and the share of groups whose
  ranking changes when only the order changes;
- length bias: the correlation, within groups, of the judge's excess over the
  reference (the score itself, without a reference) with the trajectory's
  length in generated tokens;
- variance: the share of groups whose judge scores are all equal (no gradient);
- the verdict: fit to train on when none of these failed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..diagnostics import ZERO_ADV_MAX
from ..evaluation import StrictScorer, as_strict_scorer
from ..rewards import GroupJudge, trajectory_of
from ..types import Rollout, RolloutStatus, Task
from ._checklist import CheckItem, Checklist, failed, passed, skipped
from ._judge_audit import TIE, bounded_correlation, centred, judge_in_orders, ordered_alike, pearson, position_correlation, verdict

ORDER_AGREEMENT_MIN = 0.8
SUCCESS_AGREEMENT_MIN = 0.8
POSITION_CORRELATION_MAX = 0.3
RANKING_CHANGE_MAX = 0.25
LENGTH_CORRELATION_MAX = 0.5
DEFAULT_ORDERS = 3


@dataclass(frozen=True)
class JudgedGroup:
    """One group judged in several orders: ``scores[k][rollout_id]`` and ``positions[k][rollout_id]`` (0-based)."""

    id: str
    rollouts: tuple[Rollout, ...]
    scores: tuple[Mapping[str, float], ...]
    positions: tuple[Mapping[str, int], ...]


async def ajudge_groups(
    judge: GroupJudge, rollouts: Sequence[Rollout], tasks: Mapping[str, Task], orders: int = DEFAULT_ORDERS,
    seed: int = 0,
) -> list[JudgedGroup]:
    """Judge every group of completed ``rollouts`` in ``orders`` orders (recorded, reversed, seeded shuffles)."""
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        if r.status is RolloutStatus.COMPLETED:
            groups[r.group_id].append(r)

    async def ask(gid: str, shown: list[Rollout]) -> Sequence[float]:
        task = tasks[shown[0].task_id]
        return (await judge.ajudge([trajectory_of(r, task) for r in shown])).scores

    judged = await judge_in_orders(groups, orders, seed, lambda r: r.id, ask)
    return [JudgedGroup(gid, tuple(members), *judged[gid]) for gid, members in groups.items()]


def judge_checklist(
    groups: Sequence[JudgedGroup],
    tasks: Mapping[str, Task],
    *,
    strict_scorer: StrictScorer | Callable[[Any, Any], float] | None = None,
    success_threshold: float = 1.0,
) -> Checklist:
    """The judge audit of the module docstring over judged groups."""
    if not groups:
        raise ValueError("groups: the judge audit needs judged baseline groups, got none (did every rollout fail?)")
    scorer = as_strict_scorer(strict_scorer)
    if scorer is not None:
        reference = {r.id: scorer.score(r, tasks[r.task_id]) for g in groups for r in g.rollouts}
        ref_name, ref_success = f"the strict scorer {scorer.name}", scorer.threshold
    elif all(r.reward_defaulted for g in groups for r in g.rollouts):
        reference, ref_name, ref_success = None, "", success_threshold
    else:
        reference = {r.id: r.total_reward for g in groups for r in g.rollouts}
        ref_name, ref_success = "the agent's own reward", success_threshold
    items = [
        *_agreement(groups, reference, ref_name, ref_success, success_threshold),
        *_position_bias(groups),
        _length_bias(groups, reference, ref_name),
        _variance(groups),
    ]
    fit = verdict("the judge is fit to train on", items, f"{len(groups)} groups audited",
                  "fix the first failed check (rubric, prompt, or a stronger judge model) and run this "
                  "check again before training on the judge")
    return Checklist("mtrl check reward --judge", (*items, fit))


def _agreement(
    groups: Sequence[JudgedGroup], reference: Mapping[str, float] | None, ref_name: str, ref_success: float,
    threshold: float,
) -> list[CheckItem]:
    order_name = "judge orders trajectories as the reference does"
    success_name = "judge success agrees at the threshold"
    if reference is None:
        reason = "no reference: give a strict scorer (--strict) or let the agent report its reward"
        return [skipped(order_name, reason), skipped(success_name, reason)]
    agree = pairs = 0.0
    for g in groups:
        alike, told_apart = ordered_alike([r.id for r in g.rollouts], reference, g.scores[0])
        agree += alike
        pairs += told_apart
    items = []
    if not pairs:
        items.append(skipped(order_name, f"{ref_name} scores every group's rollouts alike: no pair to order"))
    else:
        share = agree / pairs
        detail = f"{share:.0%} of {int(pairs)} pairs {ref_name} tells apart are ordered alike"
        items.append(passed(order_name, detail, order_agreement=share, pairs=int(pairs))
                     if share >= ORDER_AGREEMENT_MIN else failed(
            order_name, detail + f" (below {ORDER_AGREEMENT_MIN:.0%})",
            "read the disagreeing groups' trajectories next to the judge's explanations; sharpen the rubric "
            "toward what the strict scorer checks, or use a stronger judge model",
            order_agreement=share, pairs=int(pairs)))
    rollouts = [(g.scores[0][r.id], reference[r.id], r.id) for g in groups for r in g.rollouts]
    mismatched = [rid for judged, ref, rid in rollouts if (judged >= threshold) != (ref >= ref_success)]
    share = 1 - len(mismatched) / len(rollouts)
    detail = (f"{share:.0%} of {len(rollouts)} rollouts: judge score >= {threshold:g} exactly where "
              f"{ref_name} says success")
    items.append(passed(success_name, detail, success_agreement=share) if share >= SUCCESS_AGREEMENT_MIN else failed(
        success_name, detail + f" (below {SUCCESS_AGREEMENT_MIN:.0%}); e.g. {', '.join(mismatched[:5])}",
        "state in the rubric what a full score (1) requires, matching the task's success criterion; or set "
        "core.success_threshold to where the judge's scores separate successes",
        success_agreement=share, rollouts=mismatched))
    return items


def _position_bias(groups: Sequence[JudgedGroup]) -> list[CheckItem]:
    corr_name, rank_name = "no position bias (score vs position)", "no position bias (rankings under shuffles)"
    shuffled = [g for g in groups if len(g.scores) > 1 and len(g.rollouts) > 1]
    if not shuffled:
        reason = "no group was judged in more than one order (groups of one rollout, or --judge-orders 1)"
        return [skipped(corr_name, reason), skipped(rank_name, reason)]
    corr = position_correlation(([r.id for r in g.rollouts], g.scores, g.positions) for g in shuffled)
    detail = f"correlation of score with position {corr:+.2f} over {len(shuffled)} groups judged in shuffled orders"
    items = [bounded_correlation(
        corr_name, detail, corr, POSITION_CORRELATION_MAX, "position_correlation",
        ("earlier" if corr < 0 else "later") + " trajectories score higher for their place alone",
        "ask for scores in a fixed order with per-trajectory reasons before the score, or average the judge over "
        "several shuffled orders; a stronger judge model is less position-biased")]
    changed = [g.id for g in shuffled if len({_ranking(g, k) for k in range(len(g.scores))}) > 1]
    share = len(changed) / len(shuffled)
    detail = (f"{len(changed)} of {len(shuffled)} groups ({share:.0%}) are ranked differently when only the "
              "order changes")
    items.append(passed(rank_name, detail, ranking_changed_frac=share) if share <= RANKING_CHANGE_MAX else failed(
        rank_name, detail + f" (over {RANKING_CHANGE_MAX:.0%})",
        "the judge ranks by place, not content: have it give each trajectory a reason before its score, "
        "average it over shuffled orders, or use a stronger judge model", ranking_changed_frac=share,
        groups=changed))
    return items


def _ranking(group: JudgedGroup, order: int) -> tuple[tuple[str, str, int], ...]:
    """Each pair's order (-1, 0, 1) under the scores of ``order``."""
    scores, ids = group.scores[order], sorted(r.id for r in group.rollouts)
    return tuple((a, b, _sign(scores[a] - scores[b])) for i, a in enumerate(ids) for b in ids[i + 1:])


def _length_bias(groups: Sequence[JudgedGroup], reference: Mapping[str, float] | None, ref_name: str) -> CheckItem:
    name = "no length bias"
    xs, ys = [], []
    for g in groups:
        if len(g.rollouts) < 2:
            continue
        lengths = [float(sum(len(t.completion_ids) for t in r.turns)) for r in g.rollouts]
        excess = [g.scores[0][r.id] - (reference[r.id] if reference is not None else 0.0) for r in g.rollouts]
        xs += centred(lengths)
        ys += centred(excess)
    if not xs:
        return skipped(name, "every group has one rollout: nothing to compare within groups")
    corr = pearson(xs, ys)
    what = f"the judge's excess over {ref_name}" if reference is not None else "the judge's score"
    detail = f"correlation of {what} with length in generated tokens, within groups: {corr:+.2f}"
    return bounded_correlation(
        name, detail, corr, LENGTH_CORRELATION_MAX, "length_correlation",
        ("longer" if corr > 0 else "shorter") + " trajectories score higher for their length",
        "tell the judge in the rubric that length is not quality (judge the outcome and the actions), "
        "or add a length penalty outside the judge")


def _variance(groups: Sequence[JudgedGroup]) -> CheckItem:
    name = "judge scores vary within groups"
    sized = [g for g in groups if len(g.rollouts) >= 2]
    if not sized:
        return skipped(name, "every group has one rollout: sample more per task to check this")
    flat = [g.id for g in sized if max(g.scores[0].values()) - min(g.scores[0].values()) <= TIE]
    share = len(flat) / len(sized)
    detail = f"{len(flat)} of {len(sized)} groups ({share:.0%}) get all-equal scores"
    if share <= ZERO_ADV_MAX:
        return passed(name, detail, zero_variance_frac=share)
    return failed(name, detail + f" (over {ZERO_ADV_MAX:.0%}): those groups give no gradient",
                  "ask the rubric to separate trajectories (rank them; ties only when truly equal)",
                  zero_variance_frac=share, groups=flat)


def _sign(value: float) -> int:
    return 0 if abs(value) <= TIE else (1 if value > 0 else -1)


__all__ = [
    "DEFAULT_ORDERS",
    "JudgedGroup",
    "LENGTH_CORRELATION_MAX",
    "ORDER_AGREEMENT_MIN",
    "POSITION_CORRELATION_MAX",
    "RANKING_CHANGE_MAX",
    "SUCCESS_AGREEMENT_MIN",
    "ajudge_groups",
    "judge_checklist",
]
