"""Roles: several policies in one agent, each a LoRA adapter on the same base, trained on its own calls.

``advanced.policy_models`` may map role names to the model id each role's
calls name (``{planner: plan-model, worker: work-model}``). The coordinator
tags every captured turn with the role its call's model id names
(``Turn.role``) and asks the engine for that role's adapter
(``GenerationRequest.role``). Training sees one view of each rollout per
role (:func:`role_view`): only that role's turns, rewarded with the role's
own reward when the agent reported one (``update_reward(...,
role_rewards={...})``), else the episode's shared reward; advantages are then
computed per role within each group, by the run's advantage method, and each
role's samples update that role's adapter alone.

Schedules (``advanced.roles.schedule``): ``joint`` trains every role every
step; ``alternating`` trains one role per phase of ``phase_steps`` steps, in
the order the mapping names them, the others frozen (their rollouts still
run, with their adapters as they are).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from .types import Rollout

ROLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")  # also an adapter name and part of a metric name


class RoleSettings(BaseModel):
    """``advanced.roles``: how the roles of ``advanced.policy_models`` (a mapping) take turns training."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    schedule: Literal["joint", "alternating"] = "joint"
    phase_steps: int = Field(default=1, ge=1)  # alternating: steps each role trains before the next one's phase


@dataclass(frozen=True)
class RoleMap:
    """Role name -> the model id its calls name, in the order the config names them."""

    models: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, value: Mapping[str, Any], field: str = "policy_models") -> "RoleMap":
        """A checked map; a bad role name, model id or a model id named by two roles raises naming the field."""
        if not value:
            raise ValueError(f"{field} must name at least one role, got {dict(value)!r}")
        seen: dict[str, str] = {}
        for role, model in value.items():
            if not isinstance(role, str) or not ROLE_NAME.match(role):
                raise ValueError(f"{field}: role name {role!r} must be letters, digits, '_' or '-', starting with a "
                                 "letter (at most 64 characters): it names an adapter and its metrics")
            if not isinstance(model, str) or not model:
                raise ValueError(f"{field}.{role} must be a non-empty model id (string), got {model!r}")
            if model in seen:
                raise ValueError(f"{field}.{role}: model id {model!r} is already role {seen[model]!r}'s; each role "
                                 "needs its own model id (the coordinator tells the roles' calls apart by it)")
            seen[model] = role
        return cls(tuple(value.items()))

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(role for role, _ in self.models)

    @property
    def model_ids(self) -> tuple[str, ...]:
        return tuple(model for _, model in self.models)

    def role_of(self, model: str | None) -> str | None:
        """The role whose calls name ``model``; None where no role does."""
        return next((role for role, named in self.models if named == model), None)


def role_map(policy_models: Any) -> RoleMap | None:
    """The run's roles where ``policy_models`` is a mapping; None for a list or None (one policy)."""
    return RoleMap.parse(policy_models) if isinstance(policy_models, Mapping) else None


def trained_roles(roles: Sequence[str], settings: RoleSettings, step: int) -> tuple[str, ...]:
    """The roles whose adapters train at ``step`` (0-based): all (joint), or the phase's one (alternating)."""
    if settings.schedule == "joint":
        return tuple(roles)
    return (roles[(step // settings.phase_steps) % len(roles)],)


def role_view(rollout: Rollout, role: str) -> Rollout:
    """``rollout`` as ``role`` played it: only its turns, with its own reward where the agent reported one.

    Per-turn rewards (``turn_rewards``) follow the turns they were given for, kept by each turn's index. A
    rollout with a role reward for ``role`` gets that as its scalar reward; otherwise the episode's reward.
    """
    turns = tuple(t for t in rollout.turns if t.role == role)
    role_rewards = rollout.role_rewards or {}
    if role in role_rewards:
        return dataclasses.replace(rollout, turns=turns, reward=float(role_rewards[role]), turn_rewards=None)
    if rollout.turn_rewards is not None:
        by_index = {t.index: i for i, t in enumerate(sorted(rollout.turns, key=lambda t: t.index))}
        kept = tuple(rollout.turn_rewards[by_index[t.index]] if by_index[t.index] < len(rollout.turn_rewards)
                     else 0.0 for t in sorted(turns, key=lambda t: t.index))
        return dataclasses.replace(rollout, turns=turns, turn_rewards=kept)
    return dataclasses.replace(rollout, turns=turns)


def unknown_roles(rollout: Rollout, roles: Sequence[str]) -> list[str]:
    """Role names the agent rewarded that the run does not have (its report is refused naming them)."""
    return sorted(set(rollout.role_rewards or {}) - set(roles))


__all__ = ["ROLE_NAME", "RoleMap", "RoleSettings", "role_map", "role_view", "trained_roles", "unknown_roles"]
