"""Evaluation arithmetic: the unbiased pass@k estimator and per-record summary metrics.

Everything here is a pure function of plain records (``EvalRecord``), so the
Evaluator, the trainer's validation pass and offline analysis of an exported
run compute the same numbers.

pass@k (Chen et al., 2021): with ``n`` samples of a task of which ``c`` are
correct, the probability that at least one of ``k`` samples drawn without
replacement is correct is ``1 - C(n-c, k) / C(n, k)``. It is computed as the
product ``1 - prod_{i=n-c+1..n} (1 - k/i)``, which never forms the huge
binomials. It is undefined for ``k > n`` (there are not ``k`` distinct samples
to draw): ``pass_at_k`` raises, and ``pass_k_metrics`` leaves out any ``k``
larger than the smallest task's sample count, so every reported value is a
mean over all tasks and the curve over k stays comparable and monotone.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

PASS_K_PREFIX = "val/reward/pass_k_"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from ``n`` samples with ``c`` successes (requires ``1 <= k <= n``)."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}] (pass@k is undefined for k > n), got {k}")
    if n - c < k:  # every draw of k samples includes a success
        return 1.0
    fail_all = 1.0
    for i in range(n - c + 1, n + 1):
        fail_all *= 1.0 - k / i
    return 1.0 - fail_all


def pass_k_metrics(
    successes_per_task: Sequence[Sequence[bool]],
    ks: Iterable[int],
    *,
    prefix: str = PASS_K_PREFIX,
) -> dict[str, float]:
    """Mean pass@k over tasks for each k, as ``{prefix + str(k): value}``.

    A k larger than some task's sample count is left out (see the module docstring).
    """
    if not successes_per_task:
        raise ValueError("pass_k_metrics: successes_per_task is empty")
    counts = []
    for i, outcomes in enumerate(successes_per_task):
        if not outcomes:
            raise ValueError(f"pass_k_metrics: task {i} has no samples")
        bad = [o for o in outcomes if not isinstance(o, bool)]
        if bad:
            raise ValueError(f"pass_k_metrics: task {i} has a non-bool outcome {bad[0]!r}")
        counts.append((len(outcomes), sum(outcomes)))
    min_n = min(n for n, _ in counts)
    metrics = {}
    for k in sorted(set(ks)):
        if k < 1:
            raise ValueError(f"pass_k_metrics: every k must be >= 1, got {k}")
        if k <= min_n:
            metrics[f"{prefix}{k}"] = _mean(pass_at_k(n, c, k) for n, c in counts)
    return metrics


@dataclass(frozen=True)
class EvalRecord:
    """What evaluation keeps of one rollout.

    ``status`` is a RolloutStatus value ("completed", "failed", "timed_out").
    ``responses`` counts model responses and ``hit_token_cap_count`` those
    that stopped at the per-turn token cap (finish_reason "length").
    ``tool_calls`` names each call in order; ``metrics`` is the reward
    function's own metrics dict. ``reasoning_tokens`` counts the tokens of
    the rollout's ``reasoning_content`` (all its turns) and
    ``completion_tokens`` every token the model generated.
    """

    task_id: str
    reward: float
    success: bool
    status: str = "completed"
    turns: int = 0
    hit_turn_limit: bool = False
    hit_token_cap_count: int = 0
    responses: int = 0
    tool_calls: tuple[str, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)
    reasoning_tokens: int = 0
    completion_tokens: int = 0
    tripwires: tuple[str, ...] = ()  # the advanced.tripwires this rollout tripped

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        object.__setattr__(self, "tripwires", tuple(self.tripwires))
        object.__setattr__(self, "status", getattr(self.status, "value", self.status))
        if not math.isfinite(self.reward):
            raise ValueError(f"EvalRecord {self.task_id!r}: reward must be finite, got {self.reward!r}")
        if self.reasoning_tokens < 0 or self.completion_tokens < 0:
            raise ValueError(f"EvalRecord {self.task_id!r}: reasoning_tokens and completion_tokens must be >= 0, "
                             f"got {self.reasoning_tokens}, {self.completion_tokens}")
        if self.turns < 0 or self.responses < 0:
            raise ValueError(f"EvalRecord {self.task_id!r}: turns and responses must be >= 0, got {self.turns}, {self.responses}")
        if not 0 <= self.hit_token_cap_count <= self.responses:
            raise ValueError(f"EvalRecord {self.task_id!r}: hit_token_cap_count must be in [0, responses={self.responses}], "
                             f"got {self.hit_token_cap_count}")


def successes_by_task(records: Sequence[EvalRecord]) -> dict[str, list[bool]]:
    """Each task's outcomes in record order, tasks in first-seen order (the input of pass@k)."""
    grouped: dict[str, list[bool]] = {}
    for r in records:
        grouped.setdefault(r.task_id, []).append(bool(r.success))
    return grouped


def mean_reward(records: Sequence[EvalRecord]) -> float:
    return _mean(r.reward for r in _nonempty(records))


def success_rate(records: Sequence[EvalRecord]) -> float:
    return _mean(float(r.success) for r in _nonempty(records))


def completion_rate(records: Sequence[EvalRecord]) -> float:
    """Fraction of rollouts that ended normally (not failed, not timed out)."""
    return _mean(float(r.status == "completed") for r in _nonempty(records))


def turn_limit_rate(records: Sequence[EvalRecord]) -> float:
    """Fraction of rollouts stopped by max_turns: the turn budget was exhausted."""
    return _mean(float(r.hit_turn_limit) for r in _nonempty(records))


def token_cap_fraction(records: Sequence[EvalRecord]) -> float:
    """Fraction of all model responses that hit the per-turn token cap (0 when there were none)."""
    responses = sum(r.responses for r in _nonempty(records))
    return sum(r.hit_token_cap_count for r in records) / responses if responses else 0.0


def reasoning_fraction(records: Sequence[EvalRecord]) -> float:
    """The reasoning tokens' share of every token the model generated (0 when it generated none)."""
    generated = sum(r.completion_tokens for r in records)
    return sum(r.reasoning_tokens for r in records) / generated if generated else 0.0


def mean_turns(records: Sequence[EvalRecord]) -> float:
    return _mean(float(r.turns) for r in _nonempty(records))


def tool_call_distribution(records: Sequence[EvalRecord]) -> dict[str, float]:
    """Each tool's share of all tool calls, by name (empty when no tool was called)."""
    counts = Counter(name for r in records for name in r.tool_calls)
    total = sum(counts.values())
    return {name: counts[name] / total for name in sorted(counts)}


def metric_means(reports: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over the reports that carry it, by name."""
    values: dict[str, list[float]] = {}
    for report in reports:
        for name, value in report.items():
            values.setdefault(name, []).append(float(value))
    return {name: _mean(v) for name, v in sorted(values.items())}


def reward_metric_means(records: Sequence[EvalRecord]) -> dict[str, float]:
    """Mean of each reward-function metric over the records that report it."""
    return metric_means(r.metrics for r in records)


def eval_metrics(records: Sequence[EvalRecord], ks: Iterable[int], *, prefix: str = "val") -> dict[str, float]:
    """Every evaluation metric under ``prefix`` (``val/reward/mean``, ``val/reward/pass_k_1``, ...)."""
    records = _nonempty(records)
    metrics = {
        f"{prefix}/reward/mean": mean_reward(records),
        f"{prefix}/reward/success_rate": success_rate(records),
        f"{prefix}/completed_frac": completion_rate(records),
        f"{prefix}/turn_limit_frac": turn_limit_rate(records),
        f"{prefix}/truncated_frac": token_cap_fraction(records),
        f"{prefix}/turns/mean": mean_turns(records),
        f"{prefix}/tool_calls/mean": _mean(float(len(r.tool_calls)) for r in records),
        f"{prefix}/tokens/reasoning_mean": _mean(float(r.reasoning_tokens) for r in records),
        f"{prefix}/tokens/reasoning_frac": reasoning_fraction(records),
    }
    metrics.update(pass_k_metrics(list(successes_by_task(records).values()), ks, prefix=f"{prefix}/reward/pass_k_"))
    if any(r.tripwires for r in records):  # advanced.tripwires: the share tripped, and each wire's rollouts
        metrics[f"{prefix}/tripwires/tripped_frac"] = _mean(float(bool(r.tripwires)) for r in records)
        for name in sorted({w for r in records for w in r.tripwires}):
            metrics[f"{prefix}/tripwires/{name}"] = float(sum(name in r.tripwires for r in records))
    for name, share in tool_call_distribution(records).items():
        metrics[f"{prefix}/tool_calls/{_metric_name(name)}_frac"] = share
    for name, value in reward_metric_means(records).items():
        metrics[f"{prefix}/metrics/{_metric_name(name)}"] = value
    return metrics


def _nonempty(records: Sequence[EvalRecord]) -> Sequence[EvalRecord]:
    if not records:
        raise ValueError("no evaluation records: nothing to summarize")
    return records


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return math.fsum(values) / len(values)


def _metric_name(name: str) -> str:
    """A tool or metric name made safe for MLflow metric keys."""
    return re.sub(r"[^A-Za-z0-9_.\- ]", "_", str(name)) or "_"
