"""Which dtypes a step computes in and which the frozen base weights are stored in.

Compute: "auto" is bf16 autocast where the hardware computes it natively
(see ``resolve_autocast``). Storage: under LoRA the base weights never
change, so keeping them in fp32 only doubles their memory when every matmul
casts them to bf16 anyway; they are kept in the model's own dtype when that
is the compute dtype (a bf16 model trained under bf16 autocast), else in
fp32. LoRA weights, gradients and optimizer state stay fp32.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ...torch_support import cpu_has_native_bf16

FROZEN_BASE_DTYPES = ("model", "fp32")


def resolve_autocast(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for a precision setting on a device (None: plain fp32).

    "auto" is bf16 where the hardware computes it natively: CUDA with bf16
    support, or a CPU with AVX512-BF16 / AMX. Measured with
    ``bench/sequence_extension.py --precision-probe`` on an AVX512-BF16 CPU
    (1 thread): a SmolLM2-135M LoRA step over 1,932 tokens took 34.5 s with
    bf16 autocast against 64.6 s in fp32 (the tiny test model: 1.9 s vs
    2.2 s). CPUs without these instructions emulate bf16 and are slower with
    it, so there "auto" is fp32.
    """
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return None


def lora_inputs_uncast(model: Any, autocast_dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """While it holds, ``model``'s LoRA layers pass their input to the adapter's matmuls as it is, where the step
    computes under autocast (``autocast_dtype``; nothing changes without it).

    peft casts each LoRA layer's input to the adapter weights' dtype (fp32)
    before the adapter's matmuls, and autocast casts it back to the compute
    dtype for them: two copies of the layer's input, forward and backward,
    for the same values (the matmuls run in the compute dtype either way).
    Without them the loss, gradients and weights are the same to the bit,
    and an update of SmolLM2-135M on the aircraft example's rows takes
    32.9 s instead of 40.9 (median of 3, 1.24x; 1.14x best against best) on
    2 cores (``bench/lora_autocast.py``). It holds over whole
    forward and backward passes (an activation-checkpointed layer recomputes
    its forward in the backward one); a caller sharing ``model`` with an
    engine holds the weights lock around it, since the engine's forward
    passes, outside autocast, need the cast.
    """
    if autocast_dtype is None:
        return contextlib.nullcontext()
    from peft.helpers import disable_input_dtype_casting

    return disable_input_dtype_casting(model)


def frozen_base_dtype(setting: str, model_dtype: torch.dtype, compute_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype LoRA's frozen base weights are kept in: ``model`` (its own dtype where the step computes in
    it, else fp32) or ``fp32`` (always, the pre-issue-22 behaviour)."""
    if setting not in FROZEN_BASE_DTYPES:
        raise ValueError(f"frozen_base_dtype must be one of {FROZEN_BASE_DTYPES}, got {setting!r}")
    if setting == "model" and compute_dtype is not None and model_dtype == compute_dtype:
        return model_dtype
    return torch.float32


__all__ = ["FROZEN_BASE_DTYPES", "frozen_base_dtype", "lora_inputs_uncast", "resolve_autocast"]
