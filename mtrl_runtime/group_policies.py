"""Group policies: what a group becomes when some of its rollouts failed.

A failed or timed-out rollout is data (its status and error stay in the
store); the policy named by ``advanced.group_policy.on_failure`` decides,
after each round of rollouts of a group, whether to keep it, drop it, or run
more rollouts in place of the failed ones:

- ``drop_group``: any failure drops the whole group.
- ``keep_survivors``: keep the completed rollouts if there are at least
  ``min_survivors`` of them (capped at the group size), else drop.
- ``retry``: run one new rollout per failure, up to ``max_retries`` rounds;
  then decide as ``keep_survivors``.

A policy is a pure function of the round's counts and the group policy
settings (``config.GroupPolicyConfig``), registered by name; the config
accepts exactly the registered names. This module sits below the config
(it imports only the registry), so the config can check the name at load
and the dispatcher and ``mtrl rescore`` apply the policy it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from .registry import Registry


@dataclass(frozen=True)
class GroupRound:
    """Where a group stands after a round: rollouts completed and failed so far, retry rounds used."""

    group_size: int
    completed: int
    failed: int  # failed or timed out, not yet replaced
    retries_used: int


@dataclass(frozen=True)
class GroupDecision:
    """``keep`` the completed rollouts, ``drop`` the group, or ``retry`` n more rollouts."""

    action: str  # "keep" | "drop" | "retry"
    retry: int = 0


class GroupPolicySettings(Protocol):
    """What a policy reads of ``advanced.group_policy`` (``config.GroupPolicyConfig``)."""

    min_survivors: int
    max_retries: int


GroupPolicy = Callable[[GroupRound, GroupPolicySettings], GroupDecision]
GROUP_POLICIES: Registry[GroupPolicy] = Registry("group policy")

KEEP = GroupDecision("keep")
DROP = GroupDecision("drop")


@GROUP_POLICIES.register("drop_group")
def drop_group(state: GroupRound, cfg: GroupPolicySettings) -> GroupDecision:
    return KEEP if state.failed == 0 and state.completed > 0 else DROP


@GROUP_POLICIES.register("keep_survivors")
def keep_survivors(state: GroupRound, cfg: GroupPolicySettings) -> GroupDecision:
    needed = min(cfg.min_survivors, state.group_size)
    return KEEP if state.completed >= needed else DROP


@GROUP_POLICIES.register("retry")
def retry(state: GroupRound, cfg: GroupPolicySettings) -> GroupDecision:
    if state.failed > 0 and state.retries_used < cfg.max_retries:
        return GroupDecision("retry", state.failed)
    return keep_survivors(state, cfg)


__all__ = ["GROUP_POLICIES", "GroupDecision", "GroupPolicy", "GroupPolicySettings", "GroupRound"]
