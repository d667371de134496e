"""The update step: the trainable policy and one step of training it on a batch of samples.

``PolicyUpdate`` (``_step``) takes a step's samples to an AdamW step: token-
budget micro-batches (``_packing``: a prompt prefix the rows share runs
once), the loss from the algorithms' registry, accumulated gradients, and
the checks that skip a step with a non-finite loss or gradient
(``_nonfinite``). Its settings are ``UpdateSettings`` (``_settings``).

What the step runs on and what it costs:

- ``_policy``: the causal LM wrapped with LoRA (peft) or fully trainable,
  its reference for a KL term, the training device, atomic folder writes;
- ``_teacher``: the frozen teacher of on-policy distillation (the distill
  loss), an adapter merged onto the student's base or a model folder of the
  same tokenizer, scored in the same micro-batch as the reference;
- ``_precision``: the compute dtype (bf16 autocast where native), the
  dtype the frozen base is stored in, and the LoRA layers' inputs left to
  autocast while a step runs (no fp32 round trip);
- ``_chunked``: log-probabilities of the chosen tokens in chunks over the
  sequence, so no step holds [tokens x vocab] logits;
- ``_gradient_checkpointing``: decoder layers recompute their activations
  in the backward pass, on only while a step trains;
- ``_fit`` and ``_memory``: the step's memory estimated from the model's
  shape, micro-batches sized from free memory, a step that cannot fit
  reported before the first rollout, freed heap given back after a step.

The data-parallel step under torchrun (``training.distributed``) builds on
these names; nothing here knows of it.
"""

from __future__ import annotations

from ._chunked import DecoderWithHead, causal_lm, chunked_logprobs, decoder_and_head, splits_head
from ._fit import MIN_MICRO_BATCH_TOKENS, StepDoesNotFit, StepMemory, check_fits, folder_plan, preflight_folder
from ._nonfinite import NonFiniteWeights, nonfinite_cause, nonfinite_rollouts
from ._packing import plan_micro_batches
from ._policy import (DEFAULT_TARGET_MODULES, Policy, atomic_folder, build_policy, folder_dtype, policy_from_config,
                      policy_settings, train_device)
from ._precision import frozen_base_dtype, resolve_autocast
from ._settings import UpdateSettings
from ._teacher import TEACHER_KEY, Teacher, check_same_tokenizer, load_teacher
from ._step import TRAINER_STATE, WEIGHTS_FOLDER, PolicyUpdate, loss_normalizer

__all__ = [
    "DEFAULT_TARGET_MODULES",
    "MIN_MICRO_BATCH_TOKENS",
    "TEACHER_KEY",
    "TRAINER_STATE",
    "WEIGHTS_FOLDER",
    "DecoderWithHead",
    "NonFiniteWeights",
    "Policy",
    "PolicyUpdate",
    "StepDoesNotFit",
    "StepMemory",
    "Teacher",
    "UpdateSettings",
    "atomic_folder",
    "build_policy",
    "causal_lm",
    "check_fits",
    "check_same_tokenizer",
    "chunked_logprobs",
    "decoder_and_head",
    "folder_dtype",
    "folder_plan",
    "frozen_base_dtype",
    "load_teacher",
    "loss_normalizer",
    "nonfinite_cause",
    "nonfinite_rollouts",
    "plan_micro_batches",
    "policy_from_config",
    "policy_settings",
    "preflight_folder",
    "resolve_autocast",
    "splits_head",
    "train_device",
]
