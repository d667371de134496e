"""Advantage methods: a registry of small pure functions, named as SageMaker AI multi-turn RL names them.

Every method has one signature: ``(groups, params) -> advantages`` where
``groups`` is the step's batch of ``GroupRewards`` and ``advantages[g][i][t]``
is the advantage of turn ``t`` of rollout ``i`` of group ``g``. Methods that
score a rollout as a whole give every turn the same value. Methods that only
need their own group ignore the rest of the batch.

Notation: ``r_i`` is rollout i's total reward (the sum of its turn rewards),
``G`` the group size, ``B`` the number of rollouts in the batch, ``mean_G``
and ``std_G`` the group's mean and sample standard deviation (n - 1, as verl
and TRL compute it), ``eps`` = ``params.eps``.

``compute_advantages`` runs a method and drops the groups whose advantages
are all zero (for the group-relative methods: every reward equal); they carry
no signal and would only dilute the token mean. Their count is the metric
``analysis/zero_adv_groups``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ..registry import Registry
from ..types import Rollout

Advantages = list[list[list[float]]]  # [group][rollout][turn]


@dataclass(frozen=True)
class GroupRewards:
    """What the advantage methods see of one group.

    ``turn_rewards_G[i]`` is rollout i's per-turn rewards (at most
    ``num_turns_G[i]`` values; missing later turns count 0) or None when the
    rollout reported one scalar. ``lengths_G`` counts generated tokens.
    """

    rewards_G: tuple[float, ...]
    num_turns_G: tuple[int, ...]
    lengths_G: tuple[int, ...]
    turn_rewards_G: tuple[tuple[float, ...] | None, ...] | None = None
    group_id: str = ""

    def __post_init__(self) -> None:
        n = len(self.rewards_G)
        for name in ("num_turns_G", "lengths_G"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"GroupRewards {self.group_id!r}: {name} has {len(getattr(self, name))} "
                    f"values for {n} rewards"
                )
        if self.turn_rewards_G is not None:
            if len(self.turn_rewards_G) != n:
                raise ValueError(
                    f"GroupRewards {self.group_id!r}: turn_rewards_G has "
                    f"{len(self.turn_rewards_G)} entries for {n} rewards"
                )
            for i, turn_rewards in enumerate(self.turn_rewards_G):
                if turn_rewards is not None and len(turn_rewards) > self.num_turns_G[i]:
                    raise ValueError(
                        f"GroupRewards {self.group_id!r}: rollout {i} has {len(turn_rewards)} "
                        f"turn rewards for {self.num_turns_G[i]} turns"
                    )

    @classmethod
    def from_rollouts(cls, rollouts: Sequence[Rollout], group_id: str = "") -> "GroupRewards":
        per_turn = [r.turn_rewards for r in rollouts]
        return cls(
            rewards_G=tuple(r.total_reward for r in rollouts),
            num_turns_G=tuple(len(r.turns) for r in rollouts),
            lengths_G=tuple(sum(len(t.completion_ids) for t in r.turns) for r in rollouts),
            turn_rewards_G=tuple(per_turn) if any(x is not None for x in per_turn) else None,
            group_id=group_id,
        )

    def rewards_per_turn(self, i: int) -> list[float]:
        """Rollout i's reward at each turn: its turn rewards, or its scalar reward at the last turn."""
        n = self.num_turns_G[i]
        given = self.turn_rewards_G[i] if self.turn_rewards_G is not None else None
        if given is not None:
            return [float(x) for x in given] + [0.0] * (n - len(given))
        return [0.0] * (n - 1) + [float(self.rewards_G[i])] if n else []


@dataclass(frozen=True)
class AdvantageParams:
    """Knobs some methods read: ``eps`` (std guard), ``gamma`` (turn discount for the
    per-turn methods), ``pass_k`` and ``success_threshold`` (grpo_passk)."""

    eps: float = 1e-6
    gamma: float = 1.0
    pass_k: int = 4
    success_threshold: float = 1.0


AdvantageFn = Callable[[Sequence[GroupRewards], AdvantageParams], Advantages]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage method")


# -- helpers -----------------------------------------------------------------


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _centre(xs: Sequence[float]) -> list[float]:
    """x - mean(xs), exactly 0 when every value is equal (no float noise to leak through)."""
    if len(set(xs)) <= 1:
        return [0.0] * len(xs)
    m = _mean(xs)
    return [x - m for x in xs]


def _broadcast(group: GroupRewards, adv_G: Sequence[float]) -> list[list[float]]:
    """Give each rollout's scalar advantage to every one of its turns."""
    return [[float(a)] * n for a, n in zip(adv_G, group.num_turns_G)]


def _per_group(fn: Callable[[GroupRewards, AdvantageParams], list[float]]) -> AdvantageFn:
    """Lift a scalar-per-rollout group method to the batch signature."""

    def method(groups: Sequence[GroupRewards], params: AdvantageParams) -> Advantages:
        return [_broadcast(g, fn(g, params)) for g in groups]

    method.__doc__ = fn.__doc__
    method.__name__ = fn.__name__
    return method


def _returns_to_go(rewards_T: Sequence[float], gamma: float) -> list[float]:
    """G_t = sum_{t' >= t} gamma^(t' - t) r_t'."""
    out, running = [0.0] * len(rewards_T), 0.0
    for t in range(len(rewards_T) - 1, -1, -1):
        running = rewards_T[t] + gamma * running
        out[t] = running
    return out


# -- group-relative methods (one scalar per rollout) ------------------------


def _group_based(group: GroupRewards, params: AdvantageParams) -> list[float]:
    """GRPO: A_i = (r_i - mean_G) / (std_G + eps). Zero for a group of one."""
    r = group.rewards_G
    if len(r) < 2:
        return [0.0] * len(r)
    s = _std(r)
    return [x / (s + params.eps) for x in _centre(r)]


def _rloo(group: GroupRewards, params: AdvantageParams) -> list[float]:
    """RLOO: A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_G). Zero for a group of one."""
    r, n = group.rewards_G, len(group.rewards_G)
    if len(set(r)) <= 1:
        return [0.0] * n
    total = sum(r)
    return [x - (total - x) / (n - 1) for x in r]


def _grpo_passk(group: GroupRewards, params: AdvantageParams) -> list[float]:
    """Pass@k training, analytic advantage (Chen et al. 2025, arXiv:2508.10751).

    Success s_i = [r_i >= success_threshold]; n = G, c = #successes,
    k = min(pass_k, n). Group pass@k rho = 1 - C(n - c, k) / C(n, k),
    sigma = sqrt(rho (1 - rho)). Successes get (1 - rho) / (sigma + eps);
    failures get (1 - rho - C(n - c - 1, k - 1) / C(n - 1, k - 1)) / (sigma + eps).
    With k = 1 this is GRPO on binary rewards with the population std; with
    k = n one success makes the group's pass@k certain and every advantage 0.
    """
    n = len(group.rewards_G)
    if n < 2:
        return [0.0] * n
    success = [x >= params.success_threshold for x in group.rewards_G]
    c, k = sum(success), min(params.pass_k, n)
    rho = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    sigma = math.sqrt(rho * (1.0 - rho))
    adv_pos = (1.0 - rho) / (sigma + params.eps)
    miss = math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1) if c < n else 0.0
    adv_neg = (1.0 - rho - miss) / (sigma + params.eps)
    return [adv_pos if s else adv_neg for s in success]


def _opo(group: GroupRewards, params: AdvantageParams) -> list[float]:
    """OPO (arXiv:2505.23585): A_i = r_i - sum_j l_j r_j / sum_j l_j, the length-weighted
    optimal baseline; l_j = generated tokens of rollout j (plain mean if all are 0)."""
    r, lengths = group.rewards_G, group.lengths_G
    if len(set(r)) <= 1:
        return [0.0] * len(r)
    total_len = sum(lengths)
    b = sum(l * x for l, x in zip(lengths, r)) / total_len if total_len > 0 else _mean(r)
    return [x - b for x in r]


ADVANTAGES.register("group_based")(_per_group(_group_based))
ADVANTAGES.register("rloo")(_per_group(_rloo))
ADVANTAGES.register("grpo_passk")(_per_group(_grpo_passk))
ADVANTAGES.register("opo")(_per_group(_opo))


# -- methods that need the batch ---------------------------------------------


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(groups: Sequence[GroupRewards], params: AdvantageParams) -> Advantages:
    """REINFORCE++ (arXiv:2501.03262): A_i = (r_i - mean_B) / (std_B + eps) over every
    rollout of the batch (global normalization, no group baseline). Each rollout counts
    once (verl whitens per token, so longer responses weigh more there)."""
    flat = [x for g in groups for x in g.rewards_G]
    m, s = _mean(flat), _std(flat)
    return [_broadcast(g, [(x - m) / (s + params.eps) for x in g.rewards_G]) for g in groups]


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(groups: Sequence[GroupRewards], params: AdvantageParams) -> Advantages:
    """REINFORCE++-baseline: x_i = r_i - mean_G (group baseline), then
    A_i = (x_i - mean_B(x)) / (std_B(x) + eps) over the batch."""
    centred = [_centre(g.rewards_G) for g in groups]
    flat = [x for xs in centred for x in xs]
    m, s = _mean(flat), _std(flat)
    return [_broadcast(g, [(x - m) / (s + params.eps) for x in xs]) for g, xs in zip(groups, centred)]


@ADVANTAGES.register("gpg")
def gpg(groups: Sequence[GroupRewards], params: AdvantageParams) -> Advantages:
    """GPG (arXiv:2504.02546): A_i = alpha * (r_i - mean_G) / F_norm with F_norm = 1 and
    alpha = B / (B - M), M = rollouts in groups whose rewards are all equal (their
    gradient is zero), so the valid rollouts carry the batch's full weight."""
    centred = [_centre(g.rewards_G) for g in groups]
    total = sum(len(xs) for xs in centred)
    invalid = sum(len(g.rewards_G) for g in groups if len(set(g.rewards_G)) <= 1)
    alpha = total / (total - invalid) if total > invalid else 1.0
    return [_broadcast(g, [alpha * x for x in xs]) for g, xs in zip(groups, centred)]


# -- per-turn methods ----------------------------------------------------------


@ADVANTAGES.register("monte_carlo")
def monte_carlo(groups: Sequence[GroupRewards], params: AdvantageParams) -> Advantages:
    """Per-turn Monte Carlo return, no baseline: A_{i,t} = sum_{t' >= t} gamma^(t'-t) r_{i,t'}.

    r_{i,t} are the turn rewards, or the scalar reward at the last turn (so
    with gamma = 1 every turn gets the total reward).
    """
    return [
        [_returns_to_go(g.rewards_per_turn(i), params.gamma) for i in range(len(g.rewards_G))]
        for g in groups
    ]


@ADVANTAGES.register("group_based_per_turn")
def group_based_per_turn(groups: Sequence[GroupRewards], params: AdvantageParams) -> Advantages:
    """Per-turn return-to-go with a leave-one-out baseline over the rollouts that reached that turn.

    G_{i,t} = sum_{t' >= t} gamma^(t'-t) r_{i,t'} (turn rewards, or the scalar
    reward at the last turn). For turn t of rollout i the baseline is
    b_{i,t} = mean{ G_{j,t} : j != i, rollout j has a turn t }, or 0 when no
    other rollout of the group reached turn t; A_{i,t} = G_{i,t} - b_{i,t}.

    The baseline never uses rollout i itself, and rollouts are sampled
    independently, so E[grad log pi(a_{i,t}) * b_{i,t}] = 0: the estimate is
    unbiased even when rollouts have different numbers of turns. Comparing
    only with rollouts that HAVE turn t keeps a long rollout's late turns from
    being judged against turns that never happened. No std scaling: a scale
    computed with rollout i in it would bias the estimate.
    """
    out: Advantages = []
    for g in groups:
        returns = [_returns_to_go(g.rewards_per_turn(i), params.gamma) for i in range(len(g.rewards_G))]
        adv_g = []
        for i, own in enumerate(returns):
            adv_i = []
            for t, value in enumerate(own):
                others = [ret[t] for j, ret in enumerate(returns) if j != i and len(ret) > t]
                adv_i.append(value - _mean(others))
            adv_g.append(adv_i)
        out.append(adv_g)
    return out


# -- running a method ------------------------------------------------------------

ZERO_TOL = 1e-9


def compute_advantages(
    method: str, groups: Sequence[GroupRewards], params: AdvantageParams | None = None
) -> tuple[list[list[list[float]] | None], dict[str, float]]:
    """Run ``method`` over the batch; a group whose advantages are all zero comes back as None.

    Returns (advantages, stats): ``advantages[g]`` is ``[rollout][turn]`` or
    None for an excluded group; stats hold ``analysis/zero_adv_groups``,
    ``analysis/equal_reward_groups`` and summaries of the kept advantages.
    """
    params = params or AdvantageParams()
    raw = ADVANTAGES.get(method)(groups, params)
    kept: list[list[list[float]] | None] = []
    values: list[float] = []
    for adv_g in raw:
        flat = [a for adv_i in adv_g for a in adv_i]
        if all(abs(a) <= ZERO_TOL for a in flat):
            kept.append(None)
            continue
        kept.append(adv_g)
        values.extend(flat)
    stats = {
        "analysis/zero_adv_groups": float(sum(1 for a in kept if a is None)),
        "analysis/equal_reward_groups": float(sum(1 for g in groups if len(set(g.rewards_G)) <= 1)),
        "advantages/mean": _mean(values),
        "advantages/abs_mean": _mean([abs(v) for v in values]),
        "advantages/min": min(values, default=0.0),
        "advantages/max": max(values, default=0.0),
    }
    return kept, stats


__all__ = [
    "ADVANTAGES",
    "AdvantageFn",
    "AdvantageParams",
    "GroupRewards",
    "compute_advantages",
]
