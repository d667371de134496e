"""``mtrl online``'s settings: the ``online:`` section of its YAML beside the run's ``core`` and ``advanced``.

``load_online_config`` splits one file into the run's ``MtrlConfig`` and
``OnlineSettings``; every bad key or value is a ``ConfigError`` naming the
dotted key and the value (``online.sample_rate: ... (got 1.5)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config import ConfigError, MtrlConfig
from ..validation import validated

GROUPINGS = ("task", "feedback_key")
"""How rewarded sessions form groups: ``task`` (sessions whose tasks read alike: the same normalised prompt, or the
same ``group_key`` the entrypoint gave when it opened the session), ``feedback_key`` (the key the feedback carries)."""


class OnlineSettings(BaseModel):
    """What ``mtrl online`` samples, how long it waits for feedback, how it groups, trains and promotes."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    sample_rate: float = Field(default=0.1, gt=0.0, le=1.0)  # the share of sessions recorded as rollouts
    feedback_expiry_s: float = Field(default=7 * 24 * 3600.0, gt=0.0)  # a recorded session waits this long
    group_by: Literal["task", "feedback_key"] = "task"
    group_size: int = Field(default=4, ge=2, le=1024)  # rewarded sessions per group
    groups_per_step: int = Field(default=1, ge=1, le=4096)  # groups one training step takes
    max_staleness: int = Field(default=2, ge=0, le=1000)  # versions between a sample's policy and the learner's
    steps_per_candidate: int = Field(default=1, ge=1, le=10000)  # training steps before a candidate is gated
    holdout: str | None = None  # the held-out tasks the gate evaluates (a dataset source: PATH or PATH::SPLIT)
    holdout_samples: int = Field(default=1, ge=1, le=64)  # samples per held-out task, each side
    agent: str | None = None  # the agent the gate runs: module:function, file.py:function, or an agent server URL
    strict: str | None = None  # the strict scorer module:function; None: the reward's success (core.success_threshold)
    tick_s: float = Field(default=1.0, gt=0.0, le=3600.0)  # how often expiry is swept and ready groups trained
    seed: int = 0  # what sampling a session hashes with (a session id's draw never changes)

    @field_validator("holdout", "agent", "strict")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(f"must not be blank, got {value!r}")
        return value


def load_online_config(source: str | Path | dict[str, Any]) -> tuple[MtrlConfig, OnlineSettings]:
    """The run's config and its ``online`` section from a YAML file (or its parsed mapping)."""
    where = f"{source}: " if not isinstance(source, dict) else ""
    data = dict(source) if isinstance(source, dict) else yaml.safe_load(Path(source).read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}the top level must be a mapping, got {type(data).__name__}")
    section = data.pop("online", None) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where}online: expected a mapping, got {section!r}")
    settings = validated(OnlineSettings, section, error=ConfigError, prefix=where, under="online")
    try:
        config = MtrlConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    if settings.holdout is not None and settings.agent is None:
        raise ConfigError(f"{where}online.agent: the gate runs the held-out set ({settings.holdout!r}) through an "
                          "agent; name it (module:function or an agent server URL), got None")
    return config, settings


__all__ = ["GROUPINGS", "OnlineSettings", "load_online_config"]
