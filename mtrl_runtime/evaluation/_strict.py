"""The independent strict scorer and the reward-hacking detector.

A reward shapes training and is often lenient on purpose (partial credit, a
forgiving parser). A strict scorer (for example exact match on every field)
says only whether the task was really solved. Comparing the two on the same
rollouts finds where they disagree:

- ``reward_only``: the reward says success, the strict scorer says no. The
  policy may be exploiting the reward (a lenient parser accepting a looser
  format, a field that is never checked): read these trajectories first.
- ``strict_only``: the strict scorer says success, the reward does not: the
  reward misses correct answers and trains against them.

A scorer takes the final answer text (the last model reply) and the task's
ground truth: ``fn(text, ground_truth) -> float``. Wrap a scorer that needs
the whole trajectory as ``StrictScorer(fn, input="rollout")``: it is then
called with the ``Rollout`` (turns and tool calls) and the ground truth.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

from ..types import Rollout, Task
from ._metrics import pass_k_metrics
from ._records import final_text

REWARD_ONLY = "reward_only"  # reward success, strict failure: suspected reward hacking
STRICT_ONLY = "strict_only"  # strict success, reward failure: the reward misses correct answers


@dataclass(frozen=True)
class StrictScorer:
    """A scoring function, what it reads (``text`` or ``rollout``), and its success threshold."""

    fn: Callable[[Any, Any], float]
    input: Literal["text", "rollout"] = "text"
    threshold: float = 1.0
    name: str = ""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"strict_scorer: expected a function (text, ground_truth) -> float, got {self.fn!r}")
        if self.input not in ("text", "rollout"):
            raise ValueError(f"strict_scorer input: expected 'text' or 'rollout', got {self.input!r}")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.fn, "__name__", type(self.fn).__name__))

    def score(self, rollout: Rollout, task: Task) -> float:
        value = self.fn(final_text(rollout) if self.input == "text" else rollout, task.ground_truth)
        if isinstance(value, tuple):  # a reward-style (score, metrics) pair: the score counts
            value = value[0]
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"strict_scorer {self.name!r} returned {value!r} for rollout {rollout.id!r}; "
                             "expected a finite number")
        return float(value)


def as_strict_scorer(scorer: StrictScorer | Callable[[Any, Any], float] | None) -> StrictScorer | None:
    """``scorer`` as a StrictScorer (a plain function reads the final text)."""
    if scorer is None or isinstance(scorer, StrictScorer):
        return scorer
    return StrictScorer(scorer)


@dataclass(frozen=True)
class Disagreement:
    """One trajectory the reward and the strict scorer judge differently."""

    kind: str  # REWARD_ONLY | STRICT_ONLY
    rollout_id: str
    task_id: str
    reward: float
    strict: float
    final_text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StrictComparison:
    """Strict scores of a set of rollouts and where they disagree with the reward."""

    scorer: str
    scores: Mapping[str, float]  # rollout id -> strict score
    successes_by_task: Mapping[str, tuple[bool, ...]]
    disagreements: tuple[Disagreement, ...]
    rollouts: int

    @property
    def reward_only(self) -> tuple[Disagreement, ...]:
        return tuple(d for d in self.disagreements if d.kind == REWARD_ONLY)

    @property
    def strict_only(self) -> tuple[Disagreement, ...]:
        return tuple(d for d in self.disagreements if d.kind == STRICT_ONLY)

    @property
    def success_rate(self) -> float:
        outcomes = [o for v in self.successes_by_task.values() for o in v]
        return sum(outcomes) / len(outcomes) if outcomes else 0.0

    def metrics(self, ks: Sequence[int], prefix: str = "val") -> dict[str, float]:
        """``<prefix>/strict/...``: success rate, pass@k, and the share of each disagreement."""
        n = max(self.rollouts, 1)
        out = {
            f"{prefix}/strict/success_rate": self.success_rate,
            f"{prefix}/strict/disagree_frac": len(self.disagreements) / n,
            f"{prefix}/strict/reward_only_frac": len(self.reward_only) / n,
            f"{prefix}/strict/strict_only_frac": len(self.strict_only) / n,
        }
        if self.successes_by_task:
            out.update(pass_k_metrics([list(v) for v in self.successes_by_task.values()], ks,
                                      prefix=f"{prefix}/strict/pass_k_"))
        return out


def compare_with_strict(
    rollouts: Sequence[Rollout],
    tasks: Mapping[str, Task],
    scorer: StrictScorer,
    success_threshold: float,
) -> StrictComparison:
    """Score every rollout strictly and list where reward success and strict success differ."""
    scores: dict[str, float] = {}
    by_task: dict[str, list[bool]] = {}
    disagreements = []
    for rollout in rollouts:
        task = tasks.get(rollout.task_id)
        if task is None:
            raise KeyError(f"rollout {rollout.id!r} names task {rollout.task_id!r}, which is not among the tasks")
        strict = scorer.score(rollout, task)
        scores[rollout.id] = strict
        strict_ok = strict >= scorer.threshold
        reward_ok = rollout.total_reward >= success_threshold
        by_task.setdefault(rollout.task_id, []).append(strict_ok)
        if reward_ok != strict_ok:
            disagreements.append(Disagreement(
                REWARD_ONLY if reward_ok else STRICT_ONLY,
                rollout.id, rollout.task_id, rollout.total_reward, strict, final_text(rollout),
            ))
    return StrictComparison(
        scorer=scorer.name,
        scores=scores,
        successes_by_task={k: tuple(v) for k, v in by_task.items()},
        disagreements=tuple(disagreements),
        rollouts=len(rollouts),
    )


__all__ = [
    "REWARD_ONLY",
    "STRICT_ONLY",
    "Disagreement",
    "StrictComparison",
    "StrictScorer",
    "as_strict_scorer",
    "compare_with_strict",
]
