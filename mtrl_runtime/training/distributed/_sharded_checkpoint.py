"""A sharded policy's checkpoint in the one-process format: what rank 0 writes and reads under torchrun.

``PolicyUpdate.save_checkpoint`` writes ``weights/`` (``save_pretrained``:
the adapter, or the model) and ``trainer_state.pt`` (the optimizer state
keyed by position, as ``Optimizer.state_dict`` keys it, and the version).
DCP's full state dicts key the same things by parameter name; these helpers
turn one into the other, so a checkpoint written by one process resumes
under torchrun and the other way round (``_sharded_update``). ``load_from_rank0``
sends rank 0's weights to every rank's shard: the resume and the first load
of the model (``_rank0_weights``) both go through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from ..update import TRAINER_STATE, WEIGHTS_FOLDER, Policy, PolicyUpdate


def read_checkpoint(folder: Path, update: PolicyUpdate) -> tuple[dict[str, torch.Tensor], dict[str, Any], int]:
    """A checkpoint's trained weights keyed by the model's parameter names, its optimizer state keyed by the same
    names (as DCP's full state dicts are), and its version; on the CPU."""
    from safetensors.torch import load_file

    policy = update.policy
    files = sorted((folder / WEIGHTS_FOLDER).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {folder / WEIGHTS_FOLDER}")
    saved: dict[str, torch.Tensor] = {}
    for path in files:
        saved.update(load_file(str(path), device="cpu"))
    ids = {id(p): name for name, p in policy.model.named_parameters()}
    trained = [ids[id(p)] for group in update.optimizer.param_groups for p in group["params"]]
    weights = {}
    for name in (trained if policy.lora else [n for n, _ in policy.model.named_parameters()]):
        key = saved_key(name, policy)
        if key not in saved:
            raise ValueError(f"{folder / WEIGHTS_FOLDER}: no weight {key!r} for parameter {name!r} (saved: "
                             f"{sorted(saved)[:5]}...); the checkpoint is not of this model and these LoRA settings")
        weights[name] = saved[key]
    state = torch.load(folder / TRAINER_STATE, map_location="cpu", weights_only=True)
    return weights, named_optimizer_state(state["optimizer"], trained), int(state["version"])


def load_from_rank0(model: torch.nn.Module, weights: dict[str, torch.Tensor], *, strict: bool) -> None:
    """Rank 0's full ``weights`` (the model's state-dict names, on the CPU) into every rank's ``model``, each
    rank keeping its shard (DCP's ``broadcast_from_rank0``; a collective, the other ranks pass ``{}``).
    ``strict``: every entry of the model's state dict must be among rank 0's."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
    set_model_state_dict(model, dict(weights), options=options)  # DCP puts this rank's shards into the dict it gets


def saved_key(name: str, policy: Policy) -> str:
    """The key ``save_pretrained`` wrote parameter ``name`` under: peft drops the adapter's name (``.default``)."""
    if not policy.lora:
        return name
    adapter = getattr(policy.model, "active_adapter", "default")
    return name.replace(f".{adapter}", "")


def named_optimizer_state(optimizer_state: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """``indexed_optimizer_state``'s inverse: a positional optimizer state keyed by parameter names
    (``names``, in the optimizer's order)."""
    count = sum(len(group["params"]) for group in optimizer_state["param_groups"])
    if count != len(names):
        raise ValueError(f"the checkpoint's optimizer holds {count} parameters, this policy trains {len(names)}; "
                         "the checkpoint is not of this model and these LoRA settings")
    return {
        "state": {names[i]: value for i, value in optimizer_state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                         for group in optimizer_state["param_groups"]],
    }


def indexed_optimizer_state(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter names (DCP's full state) keyed by position, as ``Optimizer.state_dict``."""
    order = [name for group in optimizer_state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {
        "state": {index[name]: value for name, value in optimizer_state["state"].items()},
        "param_groups": [{**group, "params": [index[n] for n in group["params"]]}
                         for group in optimizer_state["param_groups"]],
    }


__all__ = ["indexed_optimizer_state", "load_from_rank0", "named_optimizer_state", "read_checkpoint", "saved_key"]
