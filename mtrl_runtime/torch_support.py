"""What this machine and a model's KV cache can do: the torch facts the engines and the trainer both ask.

Imports torch and transformers only when asked, so importing this module stays light.
"""

from __future__ import annotations

from typing import Any


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated and slower."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private torch.cpu helpers
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def plain_kv_cache(model: Any) -> bool:
    """Whether ``model``'s cache is all plain full-attention layers, whose KV can be cut and re-stacked."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # no usable config: treat the cache as opaque
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


__all__ = ["cpu_has_native_bf16", "plain_kv_cache"]
