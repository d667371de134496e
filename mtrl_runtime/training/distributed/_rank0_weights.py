"""Under torchrun only rank 0 reads the model's weights; every rank builds the model on the meta device.

``build_sharded_policy`` (every rank): rank 0 loads the folder as a one-process
run does (``build_policy`` on the CPU, LoRA adapters included) and keeps its
state dict and buffers as ``InitialWeights``; then every rank, rank 0
included, builds the same policy from the folder's config on the meta device
(no memory, no weight file read). ``materialise`` (every rank, after
``fully_shard``): ``to_empty`` allocates only this rank's shards on its
training device, DCP sends rank 0's weights (``load_from_rank0``, the
resume's broadcast), and rank 0's buffers are sent as they are.

- LoRA's initial adapter weights are rank 0's, broadcast with the rest: a
  meta-built rank has no values to initialise from, and no rank depends on
  its random seed agreeing with rank 0's.
- Tied embeddings stay tied: ``from_config`` ties the meta model as
  ``from_pretrained`` does, ``fully_shard`` keeps one parameter for both
  names and ``to_empty`` swaps it in place; a module not sharded (the frozen
  reference copy) gets one new parameter per name from ``to_empty``, so
  ``materialise`` ties them again.
- Buffers (rotary ``inv_freq`` is non-persistent: not in any state dict,
  left uninitialised by ``to_empty``) are rank 0's, computed by its real
  load, and broadcast: not recomputed by model-specific code.

Host memory per rank: rank 0 holds the whole model once (as one process
does) until ``materialise`` returns; the others hold only their shards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..update import Policy, build_policy
from ._sharded_checkpoint import load_from_rank0


@dataclass
class InitialWeights:
    """Rank 0's loaded weights (the model's state dict) and every buffer; empty on the other ranks."""

    state: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    def release(self) -> None:
        """Drop the loaded copy (after ``materialise``): rank 0 keeps only its shard."""
        self.state.clear()
        self.buffers.clear()


def build_sharded_policy(folder: str | Path, leader: bool, *, lora: bool = True,
                         base_dtype: torch.dtype = torch.float32, keep_reference: bool = False,
                         **lora_settings: Any) -> tuple[Policy, InitialWeights]:
    """Every rank's policy on the meta device, and (rank 0 only) the weights loaded from ``folder``.

    ``lora``, ``base_dtype``, ``keep_reference`` and ``lora_settings`` (rank,
    alpha, dropout, target_modules) are ``build_policy``'s.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    initial, tokenizer = InitialWeights(), None
    if leader:
        loaded = build_policy(folder, lora=lora, base_dtype=base_dtype, device="cpu", **lora_settings)
        initial = InitialWeights(dict(loaded.model.state_dict()),
                                 {name: b.detach() for name, b in loaded.model.named_buffers()})
        tokenizer = loaded.tokenizer
        del loaded
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=base_dtype if lora else torch.float32)
        policy = build_policy(model, tokenizer, lora=lora, keep_reference=keep_reference, **lora_settings)
    return policy, initial


def materialise(model: torch.nn.Module, initial: InitialWeights, device: torch.device) -> None:
    """Allocate ``model``'s (sharded) parameters on ``device`` and fill them and its buffers with rank 0's
    (a collective: every rank calls it with the same model; only rank 0's ``initial`` is read)."""
    tied = _tied_names(model)
    model.to_empty(device=device)
    for names in tied:  # a plain module's to_empty makes one new parameter per name (FSDP's swaps in place)
        first = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, leaf = name.rpartition(".")
            if model.get_parameter(name) is not first:
                setattr(model.get_submodule(owner), leaf, first)
    load_from_rank0(model, initial.state, strict=True)
    box = [initial.buffers]
    dist.broadcast_object_list(box, src=0)
    buffers = dict(model.named_buffers())
    if set(box[0]) != set(buffers):
        raise RuntimeError(f"rank {dist.get_rank()}: the meta-built model's buffers {sorted(buffers)} are not the "
                           f"loaded model's {sorted(box[0])}")
    with torch.no_grad():
        for name, value in box[0].items():
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, value.to(device))


def _tied_names(model: torch.nn.Module) -> list[list[str]]:
    """The names of each parameter shared by several modules (tied embeddings and head)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


__all__ = ["InitialWeights", "build_sharded_policy", "materialise"]
