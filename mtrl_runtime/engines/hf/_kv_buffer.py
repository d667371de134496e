"""A decode batch's KV cache in preallocated buffers: a decode step writes one column, it never copies the cache.

transformers' ``DynamicLayer`` concatenates every step (``torch.cat`` of the
whole cache per layer, keys and values): at 2,000 tokens of context that
is a full copy of the KV per decode step. ``BufferLayer`` keeps keys and
values in buffers with room for ``HEADROOM`` more columns; a step writes its
column in place and returns views of the filled part. When the room runs
out the buffer is reallocated with new room, so the copy happens once per
``HEADROOM`` steps instead of every step.

The attention then multiplies views whose batch stride is the buffer's,
not the view's: fp32 BLAS takes such strides as they are, while bf16
matmuls on CPU leave oneDNN for a generic kernel several times slower than
the copy saved (``bench/decode_long_context.py``: SmolLM2, 8 rows x 2,000
tokens). ``PaddedLayer`` (``kv_cache="padded"``) hands the attention the
whole buffer instead: contiguous, so bf16 stays on oneDNN's kernels, its
room (``PADDED_HEADROOM`` columns at most) zero and hidden by the batch's
mask, which ``reserve_columns`` widens to the buffer before each pass. The
attention reads up to that many columns more; tokens and logprobs are the
concatenation's up to float summation order (identical in bf16 in the
bench and the tests; the engine's docstring says when a token may flip).
``kv_cache="auto"``, the engine's default, preallocates for fp32 on CPU
and pads for bf16 on CPU (on a GPU neither is measured: transformers'
concatenation stays). In fp32 on a quiet 2-core box preallocated buffers
decode 1.21x (rows sharing a system prompt) to 1.48x (rows with nothing in
common) faster than the concatenation; in bf16 on an AVX512-BF16 Xeon the
padded buffers 1.13x and 1.40x.

Everything else the decode batch does (merging rows, dropping rows,
cropping padding, reading a row's KV for the prefix cache) assigns
``layer.keys`` / ``layer.values`` as before: assigning adopts the tensor as
the new buffer with no room (the next step grows it), so those paths stay
the plain-tensor code they were. Only plain full-attention layers are
converted (``buffered``); anything else keeps its own cache class.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

HEADROOM = 128  # columns of room allocated with each growth: one cache copy per this many decode steps
PADDED_HEADROOM = 32  # the same for ``padded``, whose attention reads the room too


class _FilledPart:
    """A ``BufferLayer``'s ``keys`` or ``values``: the filled columns of its buffer, read as a view; assigning a
    tensor (or None) adopts it as the buffer, filled to its last column."""

    def __init__(self, buffer: str, length: str) -> None:
        self.buffer, self.length = buffer, length  # the layer's attributes holding the buffer and its filled columns

    def __get__(self, layer: Any, owner: type | None = None) -> Any:
        if layer is None:
            return self
        buffer = getattr(layer, self.buffer)
        return None if buffer is None else buffer[:, :, : getattr(layer, self.length)]

    def __set__(self, layer: Any, tensor: torch.Tensor | None) -> None:
        setattr(layer, self.buffer, tensor)
        setattr(layer, self.length, 0 if tensor is None else tensor.shape[-2])


class BufferLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys`` / ``values`` are views of preallocated buffers (see the module docstring)."""

    zero_room = False  # whether a grown buffer's room is zeroed (its attention never reads it: no)

    def __init__(self, headroom: int = HEADROOM) -> None:
        self._keys_buf: torch.Tensor | None = None
        self._values_buf: torch.Tensor | None = None
        self._length = 0  # filled columns of the keys buffer
        self._values_length = 0  # of the values buffer: equal between updates, apart while callers assign one, then the other
        self.headroom = headroom
        super().__init__()  # sets keys = values = None through the properties

    # the filled part of the buffers; assigning adopts a tensor as the buffer (no room: the next update grows it).
    # Keys and values keep their own lengths: ``layer.keys = f(layer.keys)`` then ``layer.values = f(layer.values)``
    # must read the values as they were.
    keys = _FilledPart("_keys_buf", "_length")  # type: ignore[assignment]
    values = _FilledPart("_values_buf", "_values_length")  # type: ignore[assignment]

    @property
    def capacity(self) -> int:
        if self._keys_buf is None or self._values_buf is None:
            return 0
        return min(self._keys_buf.shape[-2], self._values_buf.shape[-2])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns after the filled part (growing the buffers if they are full); return the views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self._values_length != self._length:
            raise ValueError(f"kv cache layer: {self._length} columns of keys, {self._values_length} of values")
        if self._keys_buf is None or self._keys_buf.shape[0] != key_states.shape[0]:
            if self._length:
                raise ValueError(f"key_states: batch {key_states.shape[0]}, the cache holds {self._keys_buf.shape[0]}")
            self._keys_buf = self._values_buf = None
        if self._length + n > self.capacity:
            self._grow(key_states, value_states, self._length + n + self.headroom)
        end = self._length + n
        self._keys_buf[:, :, self._length : end] = key_states
        self._values_buf[:, :, self._length : end] = value_states
        self._length = self._values_length = end
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        allocate = torch.Tensor.new_zeros if self.zero_room else torch.Tensor.new_empty
        keys = allocate(key_states, (*key_states.shape[:2], capacity, key_states.shape[3]))
        values = allocate(value_states, (*value_states.shape[:2], capacity, value_states.shape[3]))
        if self._length:
            keys[:, :, : self._length] = self.keys
            values[:, :, : self._length] = self.values
        self._keys_buf, self._values_buf = keys, values  # the lengths stay: the filled part was copied


class PaddedLayer(BufferLayer):
    """A ``BufferLayer`` whose attention reads the whole buffer: contiguous tensors of ``capacity`` columns,
    those past the filled part zero and masked out (``reserve_columns``; see the module docstring)."""

    zero_room = True  # a masked column's key and value still enter the attention's products: zero, not garbage

    def __init__(self, headroom: int = PADDED_HEADROOM) -> None:
        super().__init__(headroom)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._length + key_states.shape[-2] > self.capacity:  # the pass's mask was built for the capacity
            raise RuntimeError(f"padded kv cache: {key_states.shape[-2]} new columns after {self._length} do not "
                               f"fit its {self.capacity}; reserve_columns() must run before the forward pass")
        super().update(key_states, value_states)
        return self._keys_buf, self._values_buf

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:  # type: ignore[override]
        """The mask covers the whole buffer (the attention reads all of it)."""
        return max(self.capacity, self.get_seq_length() + query_length), 0

    def reserve(self, n: int) -> int:
        """Room for ``n`` more columns (growing the buffers if they lack it); returns the capacity."""
        if self._keys_buf is None or self._values_buf is None:
            raise RuntimeError("padded kv cache: a layer holds no columns yet (prefill fills every layer first)")
        if self._length + n > self.capacity:
            self._grow(self._keys_buf[:, :, :0], self._values_buf[:, :, :0], self._length + n + self.headroom)
        return self.capacity


def reserve_columns(cache: Any, n: int) -> int | None:
    """Before a decode pass over a ``padded`` cache: room for ``n`` more columns in every layer; returns the
    columns the pass's attention reads (its mask's width). None for any other cache (it needs no padding)."""
    layers = getattr(cache, "layers", None) or []
    if not layers or any(type(layer) is not PaddedLayer for layer in layers):
        return None
    widths = {layer.reserve(n) for layer in layers}
    if len(widths) != 1:
        raise RuntimeError(f"padded kv cache: layers of {sorted(widths)} columns; the batch keeps them equal")
    return widths.pop()


def buffered(cache: Any, headroom: int = HEADROOM) -> Any:
    """``cache`` with each plain ``DynamicLayer`` replaced by a ``BufferLayer`` holding the same tensors.

    The tensors are adopted, not copied; the first decode step grows each
    buffer once (its one copy in the next ``headroom`` steps). A cache with
    any other kind of layer is returned as it is.
    """
    return _converted(cache, lambda: BufferLayer(headroom))


def padded(cache: Any, headroom: int = PADDED_HEADROOM) -> Any:
    """``cache`` with each plain ``DynamicLayer`` replaced by a ``PaddedLayer`` holding the same tensors (as
    ``buffered``); the batch calls ``reserve_columns`` before each pass."""
    return _converted(cache, lambda: PaddedLayer(headroom))


def _converted(cache: Any, make: Any) -> Any:
    layers = getattr(cache, "layers", None)
    if not isinstance(cache, DynamicCache) or not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return cache
    converted = []
    for layer in layers:
        new = make()
        if layer.is_initialized:
            new.dtype, new.device, new.is_initialized = layer.dtype, layer.device, True
            new.keys, new.values = layer.keys, layer.values
        converted.append(new)
    cache.layers = converted
    return cache


def concatenated(cache: Any) -> Any:
    """The cache as transformers made it: every decode step concatenates (the path before ``BufferLayer``)."""
    return cache


# engine option ``kv_cache``: how a decode batch holds its KV after prefill
KV_CACHES = {"preallocated": buffered, "padded": padded, "concat": concatenated}
AUTO_ON_CPU = {torch.float32: "preallocated", torch.bfloat16: "padded"}  # ``auto`` per weight dtype (measured)


def resolve_kv_cache(name: str, model: Any) -> str:
    """The ``kv_cache`` path for ``model``: a name of ``KV_CACHES``, or "auto" (see the module docstring)."""
    if name == "auto":  # measured on CPU only (fp32 and bf16); GPUs keep transformers' path
        weight = next(model.parameters())
        if weight.device.type != "cpu":
            return "concat"
        return AUTO_ON_CPU.get(weight.dtype, "concat")
    if name not in KV_CACHES:
        raise ValueError(f"kv_cache: expected auto or one of {sorted(KV_CACHES)}, got {name!r}")
    return name


def mergeable(layer: Any) -> bool:
    """Whether a cache layer is plain full attention, whose columns can be re-padded, cut and re-stacked."""
    return type(layer) in (DynamicLayer, BufferLayer, PaddedLayer)


__all__ = ["HEADROOM", "KV_CACHES", "PADDED_HEADROOM", "BufferLayer", "PaddedLayer", "buffered", "concatenated",
           "mergeable", "padded", "reserve_columns", "resolve_kv_cache"]
