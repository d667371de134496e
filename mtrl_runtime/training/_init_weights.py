"""Starting a run from trained weights (``advanced.init_adapter``): a LoRA adapter or a full model, checked whole.

``mtrl sft`` writes the folder; ``mtrl train`` loads it into the fresh
policy before the first rollout, so step 0's rollouts already sample from
it. Nothing is loaded partially: an adapter must carry a weight for every
LoRA weight of the policy (same rank, same target modules), a full model a
weight for every parameter (tied ones excepted), or the run does not start
and the error names the key, the folder and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .update import Policy

INIT_KEY = "advanced.init_adapter"


def load_initial_weights(policy: Policy, folder: str | Path) -> None:
    """Load ``folder`` into ``policy`` (LoRA: a peft adapter folder; full fine-tuning: a model folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{INIT_KEY}: {str(folder)!r} is not a folder (give the adapter folder mtrl sft wrote)")
    files = sorted(folder.glob("*.safetensors"))
    is_adapter = (folder / "adapter_config.json").is_file()
    if not files:
        raise ValueError(f"{INIT_KEY}: {str(folder)!r} holds no .safetensors weights")
    if policy.lora and not is_adapter:
        raise ValueError(f"{INIT_KEY}: {str(folder)!r} is not a LoRA adapter (no adapter_config.json), and this run "
                         "trains LoRA; give the adapter folder, or set advanced.full_finetune: true for a full model")
    if not policy.lora and is_adapter:
        raise ValueError(f"{INIT_KEY}: {str(folder)!r} is a LoRA adapter, and this run fine-tunes every weight "
                         "(advanced.full_finetune: true); train with LoRA, or give a full model folder")
    state = _read(files, policy.device)
    if policy.lora:
        _load_adapter(policy, folder, state)
    else:
        _load_full(policy, folder, state)


def _read(files: list[Path], device: torch.device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(str(path), device=str(device)))
    return state


def _load_adapter(policy: Policy, folder: Path, state: dict[str, torch.Tensor]) -> None:
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    saved = json.loads((folder / "adapter_config.json").read_text())
    config = policy.model.peft_config["default"]
    for key, ours in (("r", config.r), ("lora_alpha", config.lora_alpha)):
        if saved.get(key) != ours:
            field = "core.lora_rank" if key == "r" else "core.lora_alpha"
            raise ValueError(f"{INIT_KEY}: {str(folder)!r} has {key} = {saved.get(key)!r}, this run {field} = {ours}; "
                             f"set {field}: {saved.get(key)} (the adapter's) or train a new adapter")
    wanted = set(get_peft_model_state_dict(policy.model))
    missing, extra = sorted(wanted - set(state)), sorted(set(state) - wanted)
    if missing or extra:
        key, what = (missing[0], "has no weight for") if missing else (extra[0], "has a weight this policy lacks:")
        raise ValueError(f"{INIT_KEY}: {str(folder)!r} {what} {key} ({len(missing)} missing, {len(extra)} extra); "
                         "its target modules are not advanced.lora_target_modules' "
                         f"{sorted(policy.target_modules)}: use the adapter's ({saved.get('target_modules')})")
    try:
        set_peft_model_state_dict(policy.model, state)
    except RuntimeError as exc:  # shapes: an adapter of another base model
        raise ValueError(f"{INIT_KEY}: {str(folder)!r} does not fit core.model: {exc}".splitlines()[0]) from None


def _load_full(policy: Policy, folder: Path, state: dict[str, torch.Tensor]) -> None:
    model: Any = policy.model
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise ValueError(f"{INIT_KEY}: {str(folder)!r} does not fit core.model: {exc}".splitlines()[0]) from None
    params = dict(model.named_parameters())
    loaded = {params[k].data_ptr() for k in state if k in params}
    missing = [k for k in missing if k in params and params[k].data_ptr() not in loaded]  # tied weights came along
    if unexpected or missing:
        key = (unexpected or missing)[0]
        raise ValueError(f"{INIT_KEY}: {str(folder)!r} is not a model of core.model's architecture "
                         f"({len(missing)} weights missing, {len(unexpected)} unexpected, e.g. {key})")


__all__ = ["INIT_KEY", "load_initial_weights"]
