"""LoRA folded into the base weights while a model only decodes, unfolded exactly before it trains.

A peft LoRA layer computes ``base(x) + scale * B(A(x))``: two more small
matmuls, casts and Python per linear layer. For a 135M model decoding 8 rows
on CPU that makes a decode step 1.38x slower (``bench/lora_fold.py``,
SmolLM2 bf16, 2 threads: 8 rows x 64 tokens in 3.39 s through peft's layers
against 2.45 s folded; 1.89x before torch work moved to the engine's
worker thread, see ``_worker``). Folding writes
``W0 + scale * B @ A`` into each base weight and marks the layer merged, so
its forward is the base layer alone.

Folding in bf16 rounds the sum to the weight's precision; unfolding does not
subtract the delta back (that would leave the rounding in ``W0`` and let it
grow step after step) but copies back ``W0`` as it was, kept aside at the
first fold. That copy is the cost: one more copy of every adapted weight.

Only plain LoRA on ``nn.Linear`` folds (no DoRA, no ``fan_in_fan_out``, no
adapter weights trained in the base layer); any other model is left as it
is and :meth:`LoraFold.fold` reports False.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


def _lora_layers(model: Any) -> Iterator[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def _foldable(layer: Any) -> bool:
    base = layer.get_base_layer()
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    return (
        isinstance(base, torch.nn.Linear)
        and bool(active)
        and not layer.disable_adapters
        and not getattr(layer, "fan_in_fan_out", False)
        and not any(layer.use_dora.get(name, False) for name in active)
        and not getattr(layer, "lora_bias", {}).get(active[0], False)
    )


class LoraFold:
    """Fold a peft model's active LoRA adapters into its base weights, and restore them exactly."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._base: dict[str, torch.Tensor] = {}  # layer name -> its base weight before any fold
        self.folded = False

    def _layers(self) -> list[tuple[str, Any]]:
        try:
            return list(_lora_layers(self.model))
        except ImportError:  # no peft installed: nothing can be folded
            return []

    def fold(self) -> bool:
        """Write each active adapter's delta into its base weight; False (and nothing changed) if any
        layer cannot fold or there are none."""
        if self.folded:
            return True
        layers = self._layers()
        if not layers or not all(_foldable(layer) for _, layer in layers):
            return False
        with torch.no_grad():
            for name, layer in layers:
                weight = layer.get_base_layer().weight
                base = self._base.setdefault(name, weight.detach().clone())
                active = [a for a in layer.active_adapters if a in layer.lora_A]
                delta = sum(layer.get_delta_weight(a).float() for a in active)
                weight.copy_((base.float() + delta).to(weight.dtype))
                layer.merged_adapters = list(active)  # peft's flag: forward runs the base layer alone
        self.folded = True
        return True

    def unfold(self) -> None:
        """Put back every base weight as it was before folding (bit for bit) and clear the merged flags."""
        if not self.folded:
            return
        with torch.no_grad():
            for name, layer in self._layers():
                if name in self._base:
                    layer.get_base_layer().weight.copy_(self._base[name])
                layer.merged_adapters = []
        self.folded = False

    @contextlib.contextmanager
    def unfolded(self) -> Iterator[None]:
        """The model as peft computes it (unfolded) inside; folded again on the way out, whatever happened."""
        self.unfold()
        try:
            yield
        finally:
            self.fold()

    def forget(self) -> None:
        """Unfold, then drop the kept base weights (before the model's base weights change otherwise)."""
        self.unfold()
        self._base.clear()


__all__ = ["LoraFold"]
