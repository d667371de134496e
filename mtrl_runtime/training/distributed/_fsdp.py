"""FSDP2 for the policy: each decoder layer and the root sharded with ``fully_shard``, and a sharded tensor read
as this rank's shard or as its whole value."""

from __future__ import annotations

from typing import Any

import torch

from ..update import DecoderWithHead, Policy
from ._rank0_weights import InitialWeights, materialise


def shard_policy(policy: Policy, initial: InitialWeights, device: torch.device) -> None:
    """Shard a policy built on the meta device (``build_sharded_policy``) with FSDP2, then fill this rank's
    shards with rank 0's weights (``materialise``); rank 0's loaded copy is released after.

    Each decoder layer is one FSDP unit, the rest (embeddings, final norm,
    head) the root's. Gradients are summed, not averaged: each rank already
    divides its loss by the whole step's count. A frozen reference copy (full
    fine-tuning with a KL term) is not sharded: every rank fills a whole copy.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = policy.model
    base = model.get_base_model() if policy.lora else model
    for layer in _decoder_layers(base):
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain sum: gloo has no pre-multiplied sum
    materialise(model, initial, device)
    if policy.reference_model is not None:
        materialise(policy.reference_model, initial, device)
    initial.release()


def _decoder_layers(base: Any) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers causal LM (its decoder's ``layers``)."""
    decoder = base.get_decoder() if isinstance(base, DecoderWithHead) else None
    layers = decoder.layers if isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList) else None
    if layers is None:
        raise ValueError(f"distributed training: cannot find the decoder layers of {type(base).__name__} "
                         "(expected get_decoder().layers, as transformers' causal LMs have)")
    return list(layers)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value on every rank (a collective); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


__all__ = ["full_value", "local_shard", "shard_policy"]
