"""``StoreFront``: the public store methods both backends answer alike, written once.

Each checks and encodes its arguments, then hands them to the backend's
primitive: ``_store_reward`` / ``_astore_reward`` (a reward report, encoded
as ``encode_reward`` does) and ``_select_rollouts`` (the filters, the status
parsed). The memory and SQLite stores subclass it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..types import Rollout, RolloutStatus
from ._checks import check_str, status_of
from ._codec import encode_reward

RewardRow = tuple[str, "float | None", "str | None", str, bool]  # rollout id, reward, turn rewards, metrics, defaulted


class StoreFront:
    """The methods of ``types.TrajectoryStore`` whose checks both backends share (see the module docstring)."""

    def set_reward(
        self,
        rollout_id: str,
        reward: float | None = None,
        turn_rewards: Sequence[float] | None = None,
        metrics: Mapping[str, float] | None = None,
        defaulted: bool = False,
    ) -> bool:
        """Exactly one of ``reward`` / ``turn_rewards``; the latest report replaces earlier ones.

        A ``defaulted`` reward is stored only if none was reported; returns
        whether it was stored. A trained rollout's reward is fixed.
        """
        return self._store_reward(_reward_row(rollout_id, reward, turn_rewards, metrics, defaulted))

    async def aset_reward(
        self,
        rollout_id: str,
        reward: float | None = None,
        turn_rewards: Sequence[float] | None = None,
        metrics: Mapping[str, float] | None = None,
        defaulted: bool = False,
    ) -> bool:
        """``set_reward`` from an event loop."""
        return await self._astore_reward(_reward_row(rollout_id, reward, turn_rewards, metrics, defaulted))

    def rollouts(
        self,
        step: int | None = None,
        status: RolloutStatus | str | None = None,
        group_id: str | None = None,
        untrained_only: bool = False,
        with_turns: bool = True,
    ) -> list[Rollout]:
        """Rollouts matching every filter given, in creation order."""
        wanted = None if status is None else status_of("status", status)
        return self._select_rollouts(step, wanted, group_id, untrained_only, with_turns)

    # the backend's primitives
    def _store_reward(self, row: RewardRow) -> bool:
        raise NotImplementedError(f"{type(self).__name__}: a store backend defines _store_reward")

    async def _astore_reward(self, row: RewardRow) -> bool:
        raise NotImplementedError(f"{type(self).__name__}: a store backend defines _astore_reward")

    def _select_rollouts(
        self, step: int | None, status: RolloutStatus | None, group_id: str | None, untrained_only: bool,
        with_turns: bool,
    ) -> list[Rollout]:
        raise NotImplementedError(f"{type(self).__name__}: a store backend defines _select_rollouts")


def _reward_row(
    rollout_id: str, reward: float | None, turn_rewards: Sequence[float] | None,
    metrics: Mapping[str, float] | None, defaulted: bool,
) -> RewardRow:
    check_str("rollout_id", rollout_id)
    return (rollout_id, *encode_reward(reward, turn_rewards, {} if metrics is None else metrics), bool(defaulted))


__all__ = ["RewardRow", "StoreFront"]
