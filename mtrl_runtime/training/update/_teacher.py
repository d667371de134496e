"""The teacher of on-policy distillation: a frozen model that scores the student's own sampled tokens.

``advanced.distill_teacher`` names a folder: a LoRA adapter trained on
``core.model`` (its base is loaded from ``core.model``'s folder and the
adapter merged in), or a model folder whose tokenizer is the student's
(a larger model of the same family). Either way the teacher is one frozen
causal LM in eval mode, beside the policy on its device, in the dtype the
policy's frozen base is stored in; the update scores it in the same
micro-batch as the reference policy, on the same ids and kept positions,
through the same log-probability path (``_step._logprobs``), without gradients.

Why a merged copy and not a second adapter on the policy's own model: the
policy model's adapters are what checkpoints save, the engine serves and
``init_adapter`` loads; a foreign adapter living among them would travel
with every one of those. A merged copy costs one more set of base weights
(the student's size, 135M parameters for SmolLM2-135M) and touches nothing.

The tokenizers must agree token for token (the teacher scores the student's
ids): a model folder's tokenizer is compared whole (vocabulary and special
tokens) with the student's before the first rollout, and a mismatch names the
field, the folder and the first differing token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

TEACHER_KEY = "advanced.distill_teacher"


@dataclass
class Teacher:
    """A frozen causal LM that scores the student's tokens, and where it came from."""

    model: Any = field(repr=False)
    folder: Path
    kind: str  # "adapter" (merged onto the student's base) or "model"


def load_teacher(
    folder: str | Path, base_folder: Path | None, tokenizer: Any, device: torch.device, dtype: torch.dtype = torch.float32,
) -> Teacher:
    """The teacher in ``folder`` (an adapter on ``base_folder``'s model, or a model folder), frozen, on ``device``.

    ``tokenizer``: the student's, which a model folder's tokenizer must equal. ``base_folder``: the
    student's model folder (needed for an adapter only).
    """
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{TEACHER_KEY}: {str(folder)!r} is not a folder")
    if (folder / "adapter_config.json").is_file():
        from peft import PeftModel

        if base_folder is None:
            raise ValueError(f"{TEACHER_KEY}: {str(folder)!r} is a LoRA adapter; it needs core.model's folder "
                             "to merge onto")
        _check_adapter_base(folder, base_folder)
        base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=dtype)
        try:
            model = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
        except RuntimeError as exc:  # shapes: an adapter of another base model
            raise ValueError(f"{TEACHER_KEY}: {str(folder)!r} does not fit core.model "
                             f"({str(base_folder)!r}): {str(exc).splitlines()[0]}") from None
        kind = "adapter"
    elif (folder / "config.json").is_file():
        check_same_tokenizer(folder, tokenizer)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        kind = "model"
    else:
        raise ValueError(f"{TEACHER_KEY}: {str(folder)!r} holds neither adapter_config.json nor config.json")
    model = model.to(device).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return Teacher(model=model, folder=folder, kind=kind)


def check_same_tokenizer(folder: Path, tokenizer: Any) -> None:
    """Raise a ValueError naming the first difference when ``folder``'s tokenizer is not ``tokenizer``."""
    from transformers import AutoTokenizer

    if tokenizer is None:
        raise ValueError(f"{TEACHER_KEY}: {str(folder)!r}: the student has no tokenizer to compare the teacher's with")
    try:
        theirs = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{TEACHER_KEY}: {str(folder)!r} has no tokenizer to compare with core.model's "
                         f"({str(exc).splitlines()[0]})") from None
    ours_vocab, their_vocab = tokenizer.get_vocab(), theirs.get_vocab()
    if ours_vocab != their_vocab:
        differing = sorted(set(ours_vocab.items()) ^ set(their_vocab.items()), key=lambda kv: (kv[1], kv[0]))
        token, index = differing[0]
        raise ValueError(f"{TEACHER_KEY}: {str(folder)!r} has a tokenizer unlike core.model's ({len(their_vocab)} "
                         f"vs {len(ours_vocab)} tokens; first difference: {token!r} = {index}); the teacher must "
                         "score the student's own token ids, so it needs the same tokenizer")
    for name in ("eos_token", "bos_token", "pad_token"):
        if getattr(theirs, name, None) != getattr(tokenizer, name, None):
            raise ValueError(f"{TEACHER_KEY}: {str(folder)!r}: {name} is {getattr(theirs, name, None)!r}, "
                             f"core.model's is {getattr(tokenizer, name, None)!r}")


def _check_adapter_base(folder: Path, base_folder: Path) -> None:
    """An adapter saved against another local model folder is named as such before its weights are tried."""
    saved = json.loads((folder / "adapter_config.json").read_text())
    named = saved.get("base_model_name_or_path")
    if named and Path(named).is_dir() and (Path(named) / "config.json").is_file():
        ours = json.loads((base_folder / "config.json").read_text())
        theirs = json.loads((Path(named) / "config.json").read_text())
        keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")
        if any(ours.get(k) != theirs.get(k) for k in keys):
            key = next(k for k in keys if ours.get(k) != theirs.get(k))
            raise ValueError(f"{TEACHER_KEY}: {str(folder)!r} is an adapter of {named!r} ({key} = "
                             f"{theirs.get(key)!r}), not of core.model {str(base_folder)!r} ({key} = "
                             f"{ours.get(key)!r}); train the teacher adapter on core.model, or give a model folder")


__all__ = ["TEACHER_KEY", "Teacher", "check_same_tokenizer", "load_teacher"]
