"""Rollouts → samples (sequence extension), advantage methods and policy losses."""

from .advantages import ADVANTAGES, AdvantageFn, AdvantageParams, GroupRewards, compute_advantages
from .losses import LOSSES, LossFn, LossParams, aggregate
from .samples import PrefixError, SampleStats, build_samples, per_turn_samples

__all__ = [
    "ADVANTAGES",
    "AdvantageFn",
    "AdvantageParams",
    "GroupRewards",
    "LOSSES",
    "LossFn",
    "LossParams",
    "PrefixError",
    "SampleStats",
    "aggregate",
    "build_samples",
    "compute_advantages",
    "per_turn_samples",
]
