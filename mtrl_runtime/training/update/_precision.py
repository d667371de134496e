"""Which dtypes a step computes in and which the frozen base weights are stored in.

Compute: "auto" is bf16 autocast where the hardware computes it natively
(see ``resolve_autocast``). Storage: under LoRA the base weights never
change, so keeping them in fp32 only doubles their memory when every matmul
casts them to bf16 anyway; they are kept in the model's own dtype when that
is the compute dtype (a bf16 model trained under bf16 autocast), else in
fp32. LoRA weights, gradients and optimizer state stay fp32.
"""

from __future__ import annotations

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


def frozen_base_dtype(setting: str, model_dtype: torch.dtype, compute_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype LoRA's frozen base weights are kept in: ``model`` (its own dtype where the step computes in
    it, else fp32) or ``fp32`` (always, the pre-issue-22 behaviour)."""
    if setting not in FROZEN_BASE_DTYPES:
        raise ValueError(f"frozen_base_dtype must be one of {FROZEN_BASE_DTYPES}, got {setting!r}")
    if setting == "model" and compute_dtype is not None and model_dtype == compute_dtype:
        return model_dtype
    return torch.float32


__all__ = ["FROZEN_BASE_DTYPES", "frozen_base_dtype", "resolve_autocast"]
