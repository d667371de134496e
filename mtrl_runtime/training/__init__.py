"""Training: the policy update (LoRA or full), sync/async loops, checkpoints, the trainer.

Rollouts are collected by the floor below (``mtrl_runtime.rollouts``). Two
subsystems have a subpackage each: ``update/`` (the policy and one update
step: micro-batches, loss, memory, precision) and ``distributed/`` (the
same step sharded with FSDP2 under ``torchrun``). The modules beside them
run a run: the loop, the trainer, weights strategies, checkpoints, resume,
dynamic sampling, metrics and progress.

Names load on first use (PEP 562), as at the package root: ``from
mtrl_runtime.training import PolicyUpdate`` imports the update and the
policy only, not the loop, the trainer and the server they run (FastAPI,
uvicorn, MLflow), so a machine with torch and transformers alone can take
a training step (``bench/gpu.py``).
"""

from __future__ import annotations

from ..lazy import lazy_exports

# public name -> the module that defines it (relative to this package)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("DEFAULT_TARGET_MODULES", "Policy", "atomic_folder", "build_policy", "policy_from_config",
                     "train_device", "plan_micro_batches", "StepDoesNotFit", "folder_plan", "preflight_folder",
                     "WEIGHTS_FOLDER", "PolicyUpdate", "resolve_autocast", "UpdateSettings", "Teacher",
                     "load_teacher"), ".update"),
    **dict.fromkeys(("InitialWeights", "build_sharded_policy", "materialise", "ShardedUpdate", "deal_rounds",
                     "follow_training", "sharded_update_from_config", "shard_policy", "Ranks", "check_world_divides",
                     "exit_rank", "init_ranks", "join_torchrun", "launched_distributed", "rank_device"),
                    ".distributed"),
    **dict.fromkeys(("INIT_KEY", "load_initial_weights"), "._init_weights"),
    **dict.fromkeys(("PreparedBatch", "batch_options", "group_advantages", "prepare_batch", "staleness", "valid_mean"), "._batch"),
    **dict.fromkeys(("SampledStep", "sample_step", "sampling_metrics", "useful_mask"), "._dynamic_sampling"),
    **dict.fromkeys(("POLICY_FOLDER", "CheckpointState", "Checkpoints", "StepRecord"), "._checkpoint"),
    **dict.fromkeys(("StepReport", "TrainingLoop", "off_policy_bound"), "._loop"),
    **dict.fromkeys(("onset_suspects", "reward_function_metrics", "rollout_entropy", "rollout_metrics", "tripwire_counts"), "._metrics"),
    **dict.fromkeys(("ResumePlan", "plan_resume"), "._resume"),
    **dict.fromkeys(("RoleUpdates", "merge_role_batches", "prepare_role_batch", "prepare_step_batch",
                     "role_metrics"), "._roles"),
    **dict.fromkeys(("MultiTurnRLTrainer", "TrainingResult"), "._trainer"),
    **dict.fromkeys(("PushedWeights", "SharedWeights", "WeightSync", "shares_model"), "._weights"),
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
