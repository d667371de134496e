"""The strict score for the evaluator: ``mtrl eval --strict examples.coding.strict:strict_score``.

The workspace a rollout worked on is gone when the evaluator reads the
rollout, so the strict score is the one ``reward.score`` measured in the
rollout's sandbox before it was removed (every hidden input right, no other
file changed), recorded as the metric ``strict``. This module is apart from
``reward`` because the evaluator's classes load its web stack, which the
agent does not need.
"""

from __future__ import annotations

from typing import Any

from mtrl_runtime.evaluation import StrictScorer
from mtrl_runtime.types import Rollout, RolloutStatus


def _strict_of(rollout: Rollout, ground_truth: Any) -> float:
    """The strict score the agent's scorer recorded in the sandbox; 0 for a rollout that did not complete."""
    if rollout.status is not RolloutStatus.COMPLETED:
        return 0.0
    value = (rollout.metrics or {}).get("strict")
    if value is None:
        raise ValueError(f"rollout {rollout.id!r} completed without a 'strict' metric: its agent did not score it "
                         "(examples.coding.agent scores every task that has a ground truth)")
    return float(value)


strict_score = StrictScorer(_strict_of, input="rollout", name="strict_score")
"""A rollout reader: ``StrictScorer(..., input="rollout")``, which ``--strict`` loads as it is."""

__all__ = ["strict_score"]
