"""Non-finite values in an update: which rollouts carry them, what turned non-finite, and the error for weights."""

from __future__ import annotations

import math
from typing import Sequence

from ...types import Sample


class NonFiniteWeights(RuntimeError):
    """The policy holds a NaN or infinite weight: no checkpoint is written from it, none is resumed from it."""


def nonfinite_rollouts(samples: Sequence[Sample]) -> list[str]:
    """The rollouts whose samples carry a non-finite advantage or behaviour logprob."""
    return sorted({
        s.rollout_id for s in samples
        if not all(math.isfinite(a) for a in s.advantages_T) or not all(math.isfinite(x) for x in s.behaviour_logprobs_T)
    })


def nonfinite_cause(loss: float, grad_norm: float) -> str | None:
    """``"loss"`` or ``"gradients"`` when that value is not finite, else None."""
    if not math.isfinite(loss):
        return "loss"
    if not math.isfinite(grad_norm):
        return "gradients"
    return None


__all__ = ["NonFiniteWeights", "nonfinite_cause", "nonfinite_rollouts"]
