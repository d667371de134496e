"""Activation (gradient) checkpointing of the decoder layers, on only while a step trains.

A checkpointed layer keeps just its input in the forward pass and runs
again in the backward pass: activations drop from every layer's
intermediates to one hidden state per layer (plus one layer's
intermediates during its recompute), for about one more forward pass of
compute. transformers' layers checkpoint only in train() mode; the flags
are set on entry and cleared on exit so a model shared with the hf engine
serves as before. A checkpointed layer cannot write a KV cache (its
recompute would write it twice), so a step with checkpointing does not
compute shared prompt prefixes once (``_packing``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

from torch.utils.checkpoint import checkpoint


def checkpoint_layers(model: Any) -> list[Any]:
    """The modules of ``model`` transformers can checkpoint (its decoder layers); empty when none."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


@contextlib.contextmanager
def checkpointed(model: Any, enabled: bool) -> Iterator[None]:
    """Inside the block, ``model``'s decoder layers recompute their activations in the backward pass."""
    layers = checkpoint_layers(model) if enabled else []
    run = functools.partial(checkpoint, use_reentrant=False)
    saved = [(layer.gradient_checkpointing, layer.__dict__.get("_gradient_checkpointing_func")) for layer in layers]
    for layer in layers:
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = run
    try:
        yield
    finally:
        for layer, (flag, func) in zip(layers, saved):
            layer.gradient_checkpointing = flag
            if func is None:
                layer.__dict__.pop("_gradient_checkpointing_func", None)
            else:
                layer._gradient_checkpointing_func = func


__all__ = ["checkpoint_layers", "checkpointed"]
