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


def cache_of(layers: Any) -> Any:
    """A transformers ``DynamicCache`` holding ``layers`` (per layer ``(keys, values)``) as they are, no copy.

    The model's next forward concatenates its new columns to them, so a
    tensor given here may be a broadcast view or a leaf that collects
    gradients."""
    from transformers.cache_utils import DynamicCache

    layers = list(layers)
    cache = DynamicCache(ddp_cache_data=[(None, None)] * len(layers))  # plain DynamicLayers, filled below
    for cache_layer, (keys, values) in zip(cache.layers, layers):
        cache_layer.lazy_initialization(keys, values)
        cache_layer.keys, cache_layer.values = keys, values
    return cache


__all__ = ["cache_of", "cpu_has_native_bf16", "plain_kv_cache"]
