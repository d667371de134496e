"""Seeds derived from a run's seed: stable across runs, processes and machines.

Every sampled completion of a run has a seed, so a run repeated with the
same seed and the same weights draws the same tokens, whatever order its
concurrent rollouts happen to be scheduled in:

- an evaluation sample: ``derived_seed(seed, task_id, j)`` for the j-th
  sample of a task (``evaluation.sample_seed``);
- a training rollout: ``derived_seed(seed, "rollout", group_id, n)`` for the
  n-th rollout started in its group (a retry is a later n, so it draws anew);
- turn ``t`` of a rollout: ``turn_seed(seed, t)``; turn 0 keeps the
  rollout's seed, later turns draw their own, so the turns of one episode
  do not share their sampling noise.
"""

from __future__ import annotations

import hashlib

SEED_MASK = 0x7FFFFFFF  # 31 bits: every engine and client API takes them


def derived_seed(*parts: object) -> int:
    """A seed from ``parts`` (joined by ``:``), the same in every process."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & SEED_MASK


def rollout_seed(seed: int, group_id: str, serial: int) -> int:
    """The seed of the ``serial``-th rollout started in training group ``group_id``."""
    return derived_seed(seed, "rollout", group_id, serial)


def turn_seed(seed: int, turn: int) -> int:
    """The seed turn ``turn`` of a rollout seeded ``seed`` samples with (turn 0: ``seed`` itself)."""
    return seed if turn == 0 else derived_seed(seed, "turn", turn)


__all__ = ["SEED_MASK", "derived_seed", "rollout_seed", "turn_seed"]
