"""Rollouts → samples (sequence extension), advantage methods and policy losses."""

from .advantages import ADVANTAGES, AdvantageFn, AdvantageParams, GroupRewards, compute_advantages
from .compaction import EpisodeTokens, compaction_step_metrics, episode_tokens
from .losses import LOSSES, LossFn, LossParams, aggregate
from .samples import NoTokenIds, PrefixError, SampleStats, build_samples, per_turn_samples, require_token_ids

__all__ = [
    "ADVANTAGES",
    "AdvantageFn",
    "AdvantageParams",
    "EpisodeTokens",
    "GroupRewards",
    "LOSSES",
    "LossFn",
    "LossParams",
    "NoTokenIds",
    "PrefixError",
    "SampleStats",
    "aggregate",
    "build_samples",
    "compaction_step_metrics",
    "compute_advantages",
    "episode_tokens",
    "per_turn_samples",
    "require_token_ids",
]
