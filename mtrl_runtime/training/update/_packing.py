"""Micro-batches for the update, and the forward pass that computes a shared prompt prefix once.

An agent's samples share their opening: the system prompt, the tool
definitions, worked examples. In a group of 8 multi-turn samples that
opening can be two thirds of every row. A micro-batch whose rows start with
the same ``P`` tokens runs those tokens once (batch 1, with gradients), then
runs every row's remaining tokens against that prefix's KV cache expanded
to the batch. The expanded cache is a view, so the backward pass sums each
row's gradient into the one prefix: logits and gradients are those of the
full forward pass (to float error), for ``P + rows x (longest - P)`` tokens
instead of ``rows x longest``.

The prefix is cut at the first position any row trains on, so every logit
the loss reads comes from the second pass.

When every sample of a step shares a prefix (``StepPrefix``: an agent's
system prompt, tools and worked example), it runs once for the whole step,
not once per micro-batch: each micro-batch's rows attend to leaves
(detached copies of its keys and values) that collect their gradients,
and ``StepPrefix.backward`` sends what they collected through the prefix's
own forward pass once, after the last micro-batch. A micro-batch whose rows
share more than that runs the rest of its common prefix once on top of it.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from ...torch_support import cache_of, plain_kv_cache

MIN_SHARED_TOKENS = 16  # below this a second forward pass costs more than it saves


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all ``rows`` have in common."""
    if len(rows) < 2:
        return len(rows[0]) if rows else 0
    return len(os.path.commonprefix([list(r) for r in rows]))


def usable_shared(rows: int, shared: int) -> int:
    """The prefix a micro-batch of ``rows`` rows computes once: ``shared``, or 0 when sharing does not pay."""
    return shared if rows > 1 and shared >= MIN_SHARED_TOKENS else 0


def batch_cost(lengths: Sequence[int], shared: int, base: int = 0) -> int:
    """Tokens one forward pass processes for rows of ``lengths`` sharing ``shared`` leading tokens, of which
    the first ``base`` (a step prefix) were computed before it."""
    shared = max(usable_shared(len(lengths), shared), base)
    return shared - base + len(lengths) * (max(lengths) - shared)


def pack_micro_batches(
    lengths: Sequence[int], budget: int, rows: Sequence[Sequence[int]] | None = None, base: int = 0,
) -> list[tuple[list[int], int]]:
    """Group sample indices so each micro-batch's forward cost fits ``budget`` (a longer sample goes alone).

    Longest first, so rows of similar length share a batch and padding stays
    small. Without ``rows`` the cost is rows x longest row; with what each
    sample may share (its token ids up to its first trained logit) a common
    prefix counts once (see ``batch_cost``). ``base``: a prefix all samples
    share that the step computes once (``StepPrefix``); its tokens count in
    every batch's budget (they are held throughout) but are not recomputed.
    Returns (indices, shared prefix to compute once, 0 for none) per micro-batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    shared: list[int] = []  # per batch: the common prefix of its rows
    for i in order:
        if batches:
            candidate = batches[-1] + [i]
            common = min(shared[-1], common_prefix_length([rows[batches[-1][0]], rows[i]])) if rows else 0
            if base + batch_cost([lengths[j] for j in candidate], common, base) <= budget:
                batches[-1].append(i)
                shared[-1] = common
                continue
        batches.append([i])
        shared.append(len(rows[i]) if rows else 0)
    return [(batch, max(usable_shared(len(batch), common), base)) for batch, common in zip(batches, shared)]


def plan_micro_batches(
    lengths: Sequence[int], budget: int, rows: Sequence[Sequence[int]] | None = None
) -> list[list[int]]:
    """The sample indices of each micro-batch ``pack_micro_batches`` makes."""
    return [batch for batch, _ in pack_micro_batches(lengths, budget, rows)]


class StepPrefix:
    """A prompt prefix every sample of a step shares, run once with gradients for all its micro-batches.

    ``module`` is what the micro-batches run (the decoder, or the whole
    model with ``kwargs``); call it under the same autocast. See the module
    docstring for how the gradients get back.
    """

    def __init__(self, module: Any, ids_1P: torch.Tensor, **kwargs: Any) -> None:
        out = module(input_ids=ids_1P, use_cache=True, **kwargs)
        self.ids_1P = ids_1P
        self._kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self._leaves = [(k.detach().requires_grad_(k.requires_grad), v.detach().requires_grad_(v.requires_grad))
                        for k, v in self._kv]

    @property
    def length(self) -> int:
        return int(self.ids_1P.shape[1])

    def cache(self) -> Any:
        """A batch-1 cache of the prefix's leaves (the rows' gradients collect in them)."""
        return cache_of(self._leaves)

    def backward(self) -> None:
        """Send the gradients the leaves collected through the prefix's forward pass (once, after the last
        micro-batch's backward)."""
        pairs = [(tensor, leaf.grad) for kv, leaves in zip(self._kv, self._leaves) for tensor, leaf in zip(kv, leaves)
                 if tensor.requires_grad and leaf.grad is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        self._kv, self._leaves = [], []


def _prefix_then_rows(model: Any, ids_BT: torch.Tensor, shared: int, step: StepPrefix | None = None,
                      **prefix_kwargs: Any) -> tuple[Any, torch.Tensor]:
    """Run the shared prefix once (batch 1; on top of ``step``'s when given); its KV cache expanded to the
    batch, and the rows' positions."""
    if step is None:
        cache = model(input_ids=ids_BT[:1, :shared], use_cache=True, **prefix_kwargs).past_key_values
    else:
        cache = step.cache()
        if shared > step.length:
            positions = torch.arange(step.length, shared, device=ids_BT.device)[None]
            cache = model(input_ids=ids_BT[:1, step.length:shared], position_ids=positions, past_key_values=cache,
                          use_cache=True, **prefix_kwargs).past_key_values
    batch = ids_BT.shape[0]
    for layer in cache.layers:
        layer.keys = layer.keys.expand(batch, -1, -1, -1)
        layer.values = layer.values.expand(batch, -1, -1, -1)
    width = ids_BT.shape[1]
    return cache, torch.arange(shared, width, device=ids_BT.device).expand(batch, -1)


def shared_prefix_hidden(
    decoder: Any, ids_BT: torch.Tensor, attention_BT: torch.Tensor, shared: int, keep_K: torch.Tensor,
    step: StepPrefix | None = None,
) -> torch.Tensor:
    """The decoder's last hidden states at positions ``keep_K`` (all >= ``shared``): [B, K, D]."""
    cache, positions_BS = _prefix_then_rows(decoder, ids_BT, shared, step)
    out = decoder(input_ids=ids_BT[:, shared:], attention_mask=attention_BT, position_ids=positions_BS,
                  past_key_values=cache, use_cache=True)
    return out.last_hidden_state[:, keep_K - shared]


def shared_prefix_logits(
    model: Any, ids_BT: torch.Tensor, attention_BT: torch.Tensor, shared: int, keep_K: torch.Tensor,
    supports_logits_to_keep: bool, step: StepPrefix | None = None,
) -> torch.Tensor:
    """Logits at positions ``keep_K`` (all >= ``shared``) of rows whose first ``shared`` tokens are equal."""
    cache, positions_BS = _prefix_then_rows(
        model, ids_BT, shared, step, **({"logits_to_keep": 1} if supports_logits_to_keep else {}))
    rest_K = keep_K - shared
    kwargs = {"logits_to_keep": rest_K} if supports_logits_to_keep else {}
    out = model(input_ids=ids_BT[:, shared:], attention_mask=attention_BT, position_ids=positions_BS,
                past_key_values=cache, use_cache=True, **kwargs)
    return out.logits if supports_logits_to_keep else out.logits[:, rest_K]


def can_share_prefix(model: Any) -> bool:
    """Whether ``model``'s KV cache is plain per-layer keys and values (no sliding windows, no state)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return plain_kv_cache(base)


__all__ = ["MIN_SHARED_TOKENS", "StepPrefix", "batch_cost", "can_share_prefix", "common_prefix_length", "pack_micro_batches",
           "plan_micro_batches", "shared_prefix_hidden", "shared_prefix_logits", "usable_shared"]
