"""Data-parallel training under ``torchrun``: the policy sharded with FSDP2 across processes.

``ShardedUpdate`` (``_sharded_update``) stands in for ``update.PolicyUpdate``
on rank 0, which runs the run and leads every step, save and checkpoint
load; the other ranks wait in ``follow_training`` and run the same
collective work. Around it:

- ``_ranks``: joining and leaving the job, each rank's device
  (``cuda:LOCAL_RANK`` or the CPU), the checks made before joining;
- ``_rank0_weights``: only rank 0 reads the weights; every rank builds the
  policy on the meta device and receives its shards;
- ``_fsdp``: ``fully_shard`` of each decoder layer and the root, a sharded
  tensor read as this rank's shard or its whole value;
- ``_sharded_checkpoint``: the one-process checkpoint format keyed as DCP
  keys it, so a checkpoint resumes on either side.

Launch, layout and memory: docs/scaling.md.
"""

from __future__ import annotations

from ._fsdp import full_value, local_shard, shard_policy
from ._rank0_weights import InitialWeights, build_sharded_policy, materialise
from ._ranks import (Ranks, check_world_divides, exit_rank, init_ranks, join_torchrun, launched_distributed, leave_job,
                     rank_device)
from ._sharded_update import SUMMED, ShardedUpdate, deal_rounds, follow_training, sharded_update_from_config

__all__ = [
    "SUMMED",
    "InitialWeights",
    "Ranks",
    "ShardedUpdate",
    "build_sharded_policy",
    "check_world_divides",
    "deal_rounds",
    "exit_rank",
    "follow_training",
    "full_value",
    "init_ranks",
    "join_torchrun",
    "launched_distributed",
    "leave_job",
    "local_shard",
    "materialise",
    "rank_device",
    "shard_policy",
    "sharded_update_from_config",
]
