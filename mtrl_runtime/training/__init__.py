"""Training: the policy update (LoRA or full), sync/async loops, checkpoints, the trainer.

Rollouts are collected by the floor below (``mtrl_runtime.rollouts``).
"""

from ._policy import DEFAULT_TARGET_MODULES, Policy, atomic_folder, build_policy, policy_from_config, train_device
from ._packing import plan_micro_batches
from ._fit import StepDoesNotFit, preflight_folder
from ._update import WEIGHTS_FOLDER, PolicyUpdate, UpdateSettings, resolve_autocast
from ._batch import PreparedBatch, prepare_batch, staleness
from ._checkpoint import CHECKPOINTS, POLICY_FOLDER, CheckpointState, Checkpoints, StepRecord
from ._loop import StepReport, TrainingLoop, off_policy_bound
from ._metrics import reward_function_metrics, rollout_metrics
from ._resume import ResumePlan, plan_resume
from ._trainer import MultiTurnRLTrainer, TrainingResult
from ._weights import PushedWeights, SharedWeights, shares_model
from ._distributed import (Ranks, ShardedUpdate, check_world_divides, deal_rounds, follow_training, init_ranks,
                           join_torchrun, launched_distributed, shard_policy)

__all__ = [
    "Ranks",
    "ShardedUpdate",
    "check_world_divides",
    "deal_rounds",
    "follow_training",
    "join_torchrun",
    "init_ranks",
    "launched_distributed",
    "shard_policy",
    "CHECKPOINTS",
    "POLICY_FOLDER",
    "WEIGHTS_FOLDER",
    "train_device",
    "DEFAULT_TARGET_MODULES",
    "CheckpointState",
    "Checkpoints",
    "MultiTurnRLTrainer",
    "Policy",
    "PolicyUpdate",
    "PreparedBatch",
    "PushedWeights",
    "ResumePlan",
    "SharedWeights",
    "StepDoesNotFit",
    "StepRecord",
    "StepReport",
    "TrainingLoop",
    "TrainingResult",
    "UpdateSettings",
    "atomic_folder",
    "build_policy",
    "off_policy_bound",
    "plan_micro_batches",
    "plan_resume",
    "policy_from_config",
    "preflight_folder",
    "prepare_batch",
    "resolve_autocast",
    "reward_function_metrics",
    "rollout_metrics",
    "shares_model",
    "staleness",
]
