"""The online learner: a policy of its own, trained on a thread of its own, never the serving engine's.

Serving and training share no weights: the serving engine answers users with
the promoted adapter while the learner steps a separate copy (LoRA on the
same base), so no user request ever waits on a training step, only on the
CPU or GPU time both use. A candidate is the learner's weights saved as an
adapter folder (``adapters/v<version>``); the serving engine loads it only
once the gate passes. Versions are the learner's optimizer steps; a rollback
reloads an earlier adapter into the learner and gives the restored weights a
new version, so a version always names one set of weights.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from ..algorithms import AdvantageParams
from ..config import MtrlConfig
from ..engines import resolve_model
from ..rollouts import GroupResult
from ..training import PolicyUpdate, PreparedBatch, UpdateSettings, policy_from_config, prepare_batch
from ..types import Rollout


def rollout_staleness(rollout: Rollout, version: int) -> int:
    """Versions between the learner's ``version`` and the furthest policy that wrote one of the rollout's turns."""
    versions = [t.policy_version for t in rollout.turns if t.policy_version >= 0]
    return max((abs(version - v) for v in versions), default=0)


class Learner:
    """The learner's policy and its update, run on one thread of their own (see the module docstring)."""

    def __init__(self, config: MtrlConfig, update: PolicyUpdate, folder: Path, max_staleness: int) -> None:
        self.config = config
        self.update = update
        self.folder = folder
        self.max_staleness = max_staleness
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtrl-online-update")

    @classmethod
    def build(cls, config: MtrlConfig, folder: Path, max_staleness: int) -> "Learner":
        """Load the base model into a fresh LoRA policy (blocking: call it off the event loop)."""
        policy = policy_from_config(config, resolve_model(config.core.model))
        return cls(config, PolicyUpdate(policy, UpdateSettings.from_config(config)), folder, max_staleness)

    @property
    def version(self) -> int:
        return int(self.update.version)

    async def _on_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def prepare(self, groups: Sequence[GroupResult]) -> PreparedBatch:
        """Advantages over the groups, samples, and the staleness bound (``online.max_staleness``)."""
        params = AdvantageParams(success_threshold=self.config.core.success_threshold)
        return prepare_batch(groups, self.config.core.advantage_method, params, self.version, self.max_staleness)

    async def step(self, batch: PreparedBatch) -> dict[str, float]:
        """One optimizer step on the batch's samples, on the learner's thread."""
        return await self._on_thread(self.update.step, batch.samples)

    async def save(self) -> Path:
        """The learner's weights now, as the adapter folder ``adapters/v<version>``."""
        target = self.folder / f"v{self.version}"
        await self._on_thread(self.update.policy.save_weights, target)  # a version's folder holds its weights
        return target

    async def restore(self, adapter: Path, new_version: int) -> None:
        """Load ``adapter`` into the learner (a rollback, or a restart) and label the weights ``new_version``."""
        await self._on_thread(self.update.policy.load_weights, adapter)
        self.update.version = new_version

    def close(self) -> None:
        self._thread.shutdown(wait=True)


__all__ = ["Learner", "rollout_staleness"]
