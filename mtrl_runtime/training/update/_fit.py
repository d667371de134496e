"""How much memory one update step needs, the micro-batch that fits, and the error when nothing fits.

An estimate from the model's shape, not a measurement:

- weights: every parameter at its stored dtype (frozen bf16 base + fp32 LoRA, or all fp32);
- optimizer: per trainable parameter its fp32 gradient and AdamW's two moments (12 B);
- activations per token of a micro-batch: per layer, the tensors autograd keeps
  (norms, projections, attention, MLP, LoRA inputs cast to fp32), or with
  checkpointing one hidden state per layer plus one layer's worth during its recompute;
- logits: one chunk of [chunk x vocab] (logits, the fp32 copy, log-softmax, gradient),
  or per trained token without chunking.

The per-layer coefficients were fitted to the measured step peaks of
``bench/update_memory.py`` on the Qwen3-0.6B shape; with the
``STEP_MEMORY_FACTOR`` margin the estimate lands at or above each (1.52 vs
1.42 GB checkpointed, 4.07 vs 2.97 GB chunked, 6.41 vs 4.83 GB before).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

GB = 1024**3
STEP_MEMORY_FACTOR = 1.1  # a margin over the formula, which was at or above the measured step (bench/update_memory.py)
MIN_MICRO_BATCH_TOKENS = 256  # the smallest micro-batch the fit check asks room for
USABLE_FRACTION = 0.9  # of the free memory, a step plans to use


class StepDoesNotFit(MemoryError):
    """The configured model and micro-batch cannot fit in the training device's memory."""


@dataclass(frozen=True)
class StepMemory:
    """Bytes one update step needs, by part (see the module docstring)."""

    parameters: int
    trainable: int
    weights: int
    optimizer: int
    per_token: int  # activations per token of a micro-batch (with the logits when they are not chunked)
    logits_fixed: int  # the one chunk of logits (0 without chunking)
    weight_dtype: str
    logits_per_token: int = 0  # of a chunk: a micro-batch shorter than a chunk holds fewer
    weight_casts: int = 0  # bf16 copies autocast keeps of fp32 weights during a forward pass
    gathered: int = 0  # sharded (FSDP): the whole weights of the root unit and two layers, gathered at once

    def activations(self, tokens: int) -> int:
        chunk = min(self.logits_fixed, self.logits_per_token * tokens) if self.logits_per_token else self.logits_fixed
        return self.per_token * tokens + chunk + self.weight_casts + self.gathered

    def need(self, tokens: int, *, loaded: bool, optimizer_ready: bool) -> int:
        """Bytes still to allocate for a step over micro-batches of ``tokens`` (weights counted unless loaded)."""
        total = self.activations(tokens)
        total += 0 if optimizer_ready else self.optimizer
        total += 0 if loaded else self.weights
        return int(total * STEP_MEMORY_FACTOR)

    def tokens_that_fit(self, free: int, *, optimizer_ready: bool) -> int:
        """The largest micro-batch (tokens) whose step fits in ``free`` bytes (0 when none does)."""
        room = free * USABLE_FRACTION / STEP_MEMORY_FACTOR - self.logits_fixed - self.weight_casts - self.gathered
        room -= 0 if optimizer_ready else self.optimizer
        return max(0, int(room // max(self.per_token, 1)))

    def describe(self, tokens: int, free: int, device: torch.device, *, loaded: bool) -> str:
        shards = " (this rank's shards)" if self.gathered else ""
        parts = [
            f"model parameters {self.parameters:,}{shards} x {self.weight_dtype} = {self.weights / GB:.2f} GB"
            + (" (already loaded, not in 'needed')" if loaded else ""),
            f"gradients + AdamW state of {self.trainable:,} trainable parameters = {self.optimizer / GB:.2f} GB",
            f"activations of a micro-batch of {tokens:,} tokens ~ {self.activations(tokens) / GB:.2f} GB"
            + (f" (with {self.gathered / GB:.2f} GB of weights gathered from the other ranks)" if self.gathered else ""),
        ]
        need = self.need(tokens, loaded=loaded, optimizer_ready=False)
        return (f"the training step does not fit in {device} memory: " + "; ".join(parts)
                + f"; needed ~{need / GB:.2f} GB (x{STEP_MEMORY_FACTOR} margin), free {free / GB:.2f} GB")


def _shape(config: Any) -> dict[str, int]:
    hidden = int(config.hidden_size)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return {
        "hidden": hidden,
        "inter": int(getattr(config, "intermediate_size", None) or 4 * hidden),
        "layers": int(config.num_hidden_layers),
        "q": heads * head_dim,
        "kv": int(getattr(config, "num_key_value_heads", None) or heads) * head_dim,
        "vocab": int(config.vocab_size),
    }


def estimate_step(
    config: Any, parameters: int, trainable: int, weight_bytes: int, weight_dtype: str, *,
    lora: bool, compute_dtype: torch.dtype | None, checkpointing: bool, chunk_tokens: int, gathered: int = 0,
) -> StepMemory:
    """The memory of one step of a model of ``config``'s shape (see the module docstring)."""
    s = _shape(config)
    a = 2 if compute_dtype in (torch.bfloat16, torch.float16) else 4
    h, i, q, kv = s["hidden"], s["inter"], s["q"], s["kv"]
    layer = a * (10 * h + 3 * q + 4 * kv + 5 * i)  # norms, q/k/v/o, rope, attention, gate/up/act/product
    if lora:
        layer += a * (5 * h + q + i)  # the inputs of the adapted modules, as LoRA's A matmuls see them
    per_token = layer * s["layers"]
    if checkpointing:
        per_token = a * h * s["layers"] + layer
    logits_token = s["vocab"] * (a + 12)  # logits, fp32 copy, log-softmax, gradient
    if chunk_tokens > 0:
        logits_fixed = chunk_tokens * logits_token
    else:
        logits_fixed, per_token = 0, per_token + logits_token
    casts = parameters * a if a == 2 and weight_bytes > 3 * parameters else 0  # autocast's bf16 copies of fp32 weights
    return StepMemory(parameters, trainable, weight_bytes, 12 * trainable, per_token, logits_fixed, weight_dtype,
                      logits_token if chunk_tokens > 0 else 0, casts, gathered)


def estimate_for_model(model: Any, *, lora: bool, compute_dtype: torch.dtype | None, checkpointing: bool,
                       chunk_tokens: int) -> StepMemory:
    """``estimate_step`` for a built model (exact parameter counts and dtypes; of a sharded model, this rank's
    shards, plus the whole weights FSDP gathers at once: ``gathered_bytes``)."""
    params = list(model.parameters())
    seen: set[int] = set()
    unique = [_local(p) for p in params if not (id(p) in seen or seen.add(id(p)))]
    parameters = sum(p.numel() for p in unique)
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    weight_bytes = sum(p.numel() * p.element_size() for p in unique)
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in unique if not p.requires_grad} or
                    {str(p.dtype).replace("torch.", "") for p in unique})
    from ._chunked import causal_lm

    return estimate_step(causal_lm(model).config, parameters, trainable, weight_bytes, "/".join(dtypes),
                         lora=lora, compute_dtype=compute_dtype, checkpointing=checkpointing, chunk_tokens=chunk_tokens,
                         gathered=gathered_bytes(model))


def gathered_bytes(model: torch.nn.Module) -> int:
    """The whole weights an FSDP2-sharded ``model`` holds at once in a step: its root unit's (embeddings, head)
    and two other units' (a decoder layer and the next, prefetched); 0 for a model not sharded."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    units = [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
    if not units:
        return 0
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    for name, param in model.named_parameters():
        if id(param) in seen or not isinstance(param, DTensor):
            continue
        seen.add(id(param))
        unit = max((u for u in units if u == "" or name.startswith(u + ".")), key=len, default="")
        sizes[unit] = sizes.get(unit, 0) + param.numel() * param.element_size()
    root = sizes.pop("", 0)
    return root + sum(sorted(sizes.values())[-2:])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded parameter's part on this rank (a DTensor's local tensor); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def check_fits(plan: StepMemory, tokens: int, free: int, device: torch.device, *, loaded: bool) -> None:
    """Raise ``StepDoesNotFit`` with the numbers when a step over ``tokens``-token micro-batches cannot fit."""
    if plan.need(tokens, loaded=loaded, optimizer_ready=False) > free * USABLE_FRACTION:
        raise StepDoesNotFit(
            plan.describe(tokens, free, device, loaded=loaded)
            + ". Lower advanced.micro_batch_tokens, set advanced.gradient_checkpointing: on, keep LoRA "
              "(advanced.full_finetune: false) or use a device with more memory"
        )


def fit_tokens(budget: int, plan: StepMemory, free: int, *, optimizer_ready: bool) -> int:
    """``budget`` or fewer tokens per micro-batch, as free memory allows (at least 1)."""
    return max(1, min(budget, plan.tokens_that_fit(free, optimizer_ready=optimizer_ready)))


def preflight_folder(config: Any, folder: str | Path, world_size: int = 1) -> None:
    """Before a model folder is loaded for training: raise ``StepDoesNotFit`` when its step cannot fit.

    Asks room for micro-batches of ``micro_batch_tokens``
    (``MIN_MICRO_BATCH_TOKENS`` when they may shrink) for ``folder_plan``'s step.
    """
    from ._memory import available_bytes
    from ._policy import train_device

    advanced = config.advanced
    device = train_device(advanced.train_device)
    tokens = min(advanced.micro_batch_tokens, MIN_MICRO_BATCH_TOKENS) if advanced.fit_micro_batches \
        else advanced.micro_batch_tokens
    check_fits(folder_plan(config, folder, world_size), tokens, available_bytes(device), device, loaded=False)


def folder_plan(config: Any, folder: str | Path, world_size: int = 1) -> StepMemory:
    """The step's memory for a model folder not loaded yet, on one rank of ``world_size``.

    Counts the parameters on the meta device (no memory) and the LoRA
    weights on ``advanced.lora_target_modules``. Under torchrun
    (``world_size`` > 1) it counts one rank's share: its shards of the
    weights, gradients and AdamW state, and the whole weights of the FSDP
    units gathered at once (the root and two decoder layers).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from ._policy import folder_dtype, train_device
    from ._precision import frozen_base_dtype, resolve_autocast

    advanced = config.advanced
    device = train_device(advanced.train_device)
    model_config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(model_config)
    unique = {id(p): p for p in meta.parameters()}.values()
    parameters = sum(p.numel() for p in unique)
    lora = not advanced.full_finetune
    compute = resolve_autocast(advanced.precision, device)
    if lora:
        targets = set(advanced.lora_target_modules)
        trainable = sum(config.core.lora_rank * (m.in_features + m.out_features) for name, m in meta.named_modules()
                        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets)
        base = frozen_base_dtype(advanced.frozen_base_dtype, folder_dtype(Path(folder)), compute)
        weight_bytes = parameters * base.itemsize + trainable * 4
        dtype = str(base).replace("torch.", "")
    else:
        trainable, weight_bytes, dtype = parameters, parameters * 4, "float32"
    gathered = 0
    if world_size > 1:
        layers = int(model_config.num_hidden_layers)
        per_param = weight_bytes / parameters
        outside = sum(p.numel() for n, p in meta.named_parameters(remove_duplicate=True) if ".layers." not in n)
        gathered = int((outside + 2 * (parameters - outside) / layers) * per_param)
        parameters, trainable = -(-parameters // world_size), -(-trainable // world_size)
        weight_bytes = -(-weight_bytes // world_size)
    recompute = advanced.gradient_checkpointing != "off"
    plan = estimate_step(model_config, parameters, trainable, weight_bytes, dtype, lora=lora, compute_dtype=compute,
                         checkpointing=recompute, chunk_tokens=advanced.logprob_chunk_tokens, gathered=gathered)
    return plan


__all__ = ["MIN_MICRO_BATCH_TOKENS", "STEP_MEMORY_FACTOR", "StepDoesNotFit", "StepMemory", "check_fits",
           "estimate_for_model", "estimate_step", "fit_tokens", "folder_plan", "gathered_bytes", "preflight_folder"]
