"""Loading a model folder into transformers for the hf engine: dtype, weights, LoRA adapters, eos ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...torch_support import cpu_has_native_bf16

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}


def auto_dtype(device: str) -> str:
    """``dtype: auto``: bf16 on CUDA and on a CPU with native bf16, fp32 on other CPUs.

    Measured on an AVX512-BF16 CPU (SmolLM2-135M, 8 rows x 32 tokens, 1
    thread, ``bench/vllm_vs_hf.py``'s hf side): 122 tokens/s with bf16
    weights against 83 with fp32.
    """
    if not str(device).startswith("cpu"):
        return "bf16"
    return "bf16" if cpu_has_native_bf16() else "fp32"


def load_pretrained(folder: Path, dtype: str, device: str) -> tuple[Any, Any]:
    """Load the causal LM and tokenizer of a local folder, in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, DTYPES[dtype]))
    model.to(device)
    model.eval()
    return model, tokenizer


def load_lora_adapter(model: Any, folder: Path, name: str, replaces: str | None = None) -> Any:
    """Load the peft adapter at ``folder`` as ``name`` and make it the active one.

    A plain model is wrapped in a ``PeftModel`` (peft injects the LoRA layers
    into it in place); ``replaces`` names an adapter loaded earlier that is
    deleted once the new one is active. Returns the model to run.
    """
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model.load_adapter(str(folder), adapter_name=name)
        model.set_adapter(name)
        if replaces is not None and replaces != name:
            model.delete_adapter(replaces)
    else:
        model = PeftModel.from_pretrained(model, str(folder), adapter_name=name)
    model.eval()
    return model


def default_eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end a completion: the tokenizer's and model's eos, and ``<|im_end|>``."""
    found: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    for source in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None),
                   getattr(model.config, "eos_token_id", None)):
        if isinstance(source, int):
            found.add(source)
        elif isinstance(source, (list, tuple)):
            found.update(int(i) for i in source)
    im_end = tokenizer.get_vocab().get("<|im_end|>")
    if im_end is not None:
        found.add(im_end)
    return found


__all__ = ["DTYPES", "auto_dtype", "default_eos_ids", "load_lora_adapter", "load_pretrained"]
