"""Per-step rollout metrics, under the names DESIGN.md gives them.

``rollout/reward/mean`` averages every rollout that ended in the step
(failed ones count with the reward they were given); ``reported_mean``
(mtrl's own figure) only completed rollouts whose agent reported a reward;
``zero_frac`` is the share of rollouts whose reward is 0. SageMaker's
``rollout/reward/valid_mean`` (the mean over groups with non-zero advantage)
needs the advantages, so ``_batch.prepare_batch`` computes it.
``rollout/tokens/response_max`` and ``response_mean`` are, as SageMaker
AI MTRL means them, per response (one model turn); mtrl's per-rollout
figures are ``rollout/tokens/rollout_max`` and ``rollout_mean``. The reward
function's own metrics are averaged over the rollouts that report them, as
``rollout/metrics/<name>``. ``rollout/flagged/<flag>`` counts the step's
rollouts carrying each of ``types.ROLLOUT_FLAGS`` (what mtrl could not
capture or decide: unrecorded tool calls, refused or inferred model calls,
defaulted rewards, tripped tripwires); ``rollout/tripwires/<wire>`` counts the
rollouts each tripwire tripped on. ``rollout/tokens/reasoning_mean`` is the
reasoning tokens a rollout wrote (each turn's ``reasoning_tokens``, what its
chat format parsed as ``reasoning_content``), and ``reasoning_frac`` their
share of all generated tokens. ``policy/entropy`` is the mean surprisal of
the tokens the policy sampled (-logprob, from the logprobs recorded at
generation; no extra pass): at temperature 1 an unbiased estimate of the
behaviour policy's per-token entropy, and its rise and fall at any other
temperature. The ``hack_onset`` diagnostics rule reads it.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ..evaluation import metric_means, tripped_wires
from ..evaluation import reward_function_metrics as rollout_reward_metrics
from ..types import ROLLOUT_FLAGS, Rollout, RolloutStatus


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def rollout_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Reward, turn, token and reward-function metrics of one step's rollouts."""
    rewards = [r.total_reward for r in rollouts]
    valid = [r.total_reward for r in rollouts if r.status is RolloutStatus.COMPLETED and not r.reward_defaulted]
    response_tokens = [sum(len(t.completion_ids) for t in r.turns) for r in rollouts]  # per rollout
    reasoning_tokens = [sum(t.reasoning_tokens for t in r.turns) for r in rollouts]
    turns = [t for r in rollouts for t in r.turns]
    turn_tokens = [len(t.completion_ids) for t in turns]  # per response
    metrics = {
        "rollout/count": float(len(rollouts)),
        "rollout/reward/mean": _mean(rewards),
        "rollout/reward/reported_mean": _mean(valid),
        "rollout/reward/zero_frac": _mean([float(x == 0.0) for x in rewards]),
        "rollout/reward/max": max(rewards, default=0.0),
        "rollout/reward/min": min(rewards, default=0.0),
        "rollout/reward_defaulted_frac": _mean([float(r.reward_defaulted) for r in rollouts]),
        "rollout/completed_frac": _mean([float(r.status is RolloutStatus.COMPLETED) for r in rollouts]),
        "rollout/turns/mean": _mean([float(len(r.turns)) for r in rollouts]),
        "rollout/tool_calls/mean": _mean([float(len(r.tool_calls)) for r in rollouts]),
        "rollout/tokens/response_max": float(max(turn_tokens, default=0)),
        "rollout/tokens/response_mean": _mean([float(n) for n in turn_tokens]),
        "rollout/tokens/rollout_max": float(max(response_tokens, default=0)),
        "rollout/tokens/rollout_mean": _mean([float(n) for n in response_tokens]),
        "rollout/tokens/reasoning_mean": _mean([float(n) for n in reasoning_tokens]),
        "rollout/tokens/reasoning_frac": sum(reasoning_tokens) / max(sum(response_tokens), 1),
        "rollout/truncated_frac": _mean([float(t.finish_reason == "length") for t in turns]),
        "rollout/malformed_tool_calls": float(sum(t.malformed_tool_call for t in turns)),
        "rollout/prefix_breaks": float(sum(t.break_reason is not None for t in turns)),
    }
    surprisal = [-lp for t in turns if t.model is None for lp in t.logprobs]
    if surprisal:  # no policy token at all (every call failed, or a reference model's): no estimate
        metrics["policy/entropy"] = sum(surprisal) / len(surprisal)
    for flag in ROLLOUT_FLAGS:
        metrics[f"rollout/flagged/{flag}"] = float(sum(flag in r.flags for r in rollouts))
    for name, count in tripwire_counts(rollouts).items():
        metrics[f"rollout/tripwires/{name}"] = count
    for name, value in reward_function_metrics(rollouts).items():
        metrics[f"rollout/metrics/{name}"] = value
    return metrics


def rollout_entropy(rollout: Rollout) -> float | None:
    """One rollout's mean surprisal per policy token (``policy/entropy``'s per-rollout figure); None without tokens."""
    values = [-lp for t in rollout.turns if t.model is None for lp in t.logprobs]
    return sum(values) / len(values) if values else None


def onset_suspects(rollouts: Sequence[Rollout], n: int = 5) -> list[str]:
    """The rollouts that drive a hack-onset pattern: above the step's mean reward, highest entropy first."""
    if not rollouts:
        return []
    mean = _mean([r.total_reward for r in rollouts])
    scored = [(e, r.id) for r in rollouts if r.total_reward > mean and (e := rollout_entropy(r)) is not None]
    return [rid for _, rid in sorted(scored, reverse=True)[:n]]


def tripwire_counts(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Each tripwire's number of rollouts it tripped on (``advanced.tripwires``; the wire's metric ``tripwire/<name>``)."""
    counts = Counter(name for rollout in rollouts for name in tripped_wires(rollout))
    return {name: float(counts[name]) for name in sorted(counts)}


def reward_function_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Mean of each metric the agents reported with ``update_reward``, over the rollouts reporting it (the rule
    evaluation's ``val/metrics/<name>`` uses: ``evaluation.reward_function_metrics``)."""
    return metric_means(rollout_reward_metrics(r) for r in rollouts)


__all__ = ["onset_suspects", "reward_function_metrics", "rollout_entropy", "rollout_metrics", "tripwire_counts"]
