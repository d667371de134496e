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

Rows without the adapter (``rows_as`` with ``BASE``): in a batch that mixes rows
for the fine-tuned model and rows for its base model (an evaluation's two
sides at once), each adapted layer's output for the base rows has the
adapter's term taken off again, ``- scale * B(A(x))`` for those rows only
(a forward hook per layer), whether the delta is folded into the weight or
added by peft's forward. In fp32 that is the base model's output to float
error; in bf16 the folded weight's rounding stays in it, as it does in
the fine-tuned rows.

Rows of other adapters (``rows_as``, roles): a model may hold several
adapters by name (one per role, ``mtrl_runtime.roles``), one of them active
(folded, or added by peft's forward). A row of another adapter gets, per
adapted layer, the active adapter's term taken off and its own added,
``- s_a * B_a(A_a(x)) + s_r * B_r(A_r(x))`` for its rows only: rows of
different adapters decode in one batch, each as if its adapter alone were
served (same tokens as serving it alone, up to float summation order).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch

ACTIVE = ""  # a row decoded with the adapter served now (folded or active)
BASE = "<base>"  # a row decoded with the adapter switched off (the base model); never a role's name (``roles``)


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

    def per_row(self) -> bool:
        """Whether rows can be served without the adapter beside rows with it (``rows_as``): the model
        holds LoRA layers, all of a kind whose term can be taken off per row (those ``fold`` folds)."""
        layers = self._layers()
        return bool(layers) and all(_foldable(layer) or layer.disable_adapters for _, layer in layers)

    def adapters(self) -> frozenset[str]:
        """The names of the LoRA adapters the model holds (a row may decode with any of them, ``rows_as``)."""
        layers = self._layers()
        return frozenset(layers[0][1].lora_A) if layers else frozenset()

    @contextlib.contextmanager
    def rows_as(self, variants_B: list[str] | str | None) -> Iterator[None]:
        """Forward passes inside compute each row ``b`` as ``variants_B[b]`` says (``ACTIVE``: as served; ``BASE``:
        without the adapter; an adapter's name: with that adapter instead of the active one); one string: every
        row of every pass, whatever its batch size; None: all ACTIVE."""
        if variants_B is None or variants_B == ACTIVE:
            yield
            return
        if isinstance(variants_B, str):
            groups: list[tuple[str, torch.Tensor | None]] = [(variants_B, None)]
        else:
            device = next(iter(self.model.parameters())).device
            groups = [(name, torch.tensor([b for b, v in enumerate(variants_B) if v == name], device=device))
                      for name in sorted(set(variants_B) - {ACTIVE})]
        handles = [layer.register_forward_hook(functools.partial(_switch_adapter, groups))
                   for _, layer in self._layers() if not layer.disable_adapters]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def forget(self) -> None:
        """Unfold, then drop the kept base weights (before the model's base weights change otherwise)."""
        self.unfold()
        self._base.clear()


def _lora_term(layer: Any, name: str, x: torch.Tensor) -> torch.Tensor:
    lora_A, lora_B = layer.lora_A[name], layer.lora_B[name]
    return lora_B(lora_A(x.to(lora_A.weight.dtype))) * layer.scaling[name]


def _switch_adapter(groups: list[tuple[str, torch.Tensor | None]], layer: Any, args: tuple[Any, ...],
                    out: torch.Tensor) -> torch.Tensor:
    """Forward hook: for each (variant, rows ``index_R``; None: all), the layer's output for those rows with the
    active adapters' term taken off and, for an adapter's name, that adapter's term added instead."""
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    for variant, index_R in groups:
        if variant in active:  # already what the layer computed
            continue
        x_R = args[0] if index_R is None else args[0].index_select(0, index_R)
        delta = None
        for name in active:
            term = -_lora_term(layer, name, x_R)
            delta = term if delta is None else delta + term
        if variant != BASE:
            own = _lora_term(layer, variant, x_R)
            delta = own if delta is None else delta + own
        if delta is None:
            continue
        if index_R is None:
            out.add_(delta.to(out.dtype))
        else:
            out.index_add_(0, index_R, delta.to(out.dtype))  # in place: served passes record no grads
    return out


__all__ = ["ACTIVE", "BASE", "LoraFold"]
