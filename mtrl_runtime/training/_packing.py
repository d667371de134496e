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
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from ..torch_support import plain_kv_cache

MIN_SHARED_TOKENS = 16  # below this a second forward pass costs more than it saves


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all ``rows`` have in common."""
    if len(rows) < 2:
        return len(rows[0]) if rows else 0
    return len(os.path.commonprefix([list(r) for r in rows]))


def usable_shared(rows: int, shared: int) -> int:
    """The prefix a micro-batch of ``rows`` rows computes once: ``shared``, or 0 when sharing does not pay."""
    return shared if rows > 1 and shared >= MIN_SHARED_TOKENS else 0


def batch_cost(lengths: Sequence[int], shared: int) -> int:
    """Tokens one forward pass processes for rows of ``lengths`` sharing ``shared`` leading tokens."""
    shared = usable_shared(len(lengths), shared)
    return shared + len(lengths) * (max(lengths) - shared)


def pack_micro_batches(
    lengths: Sequence[int], budget: int, rows: Sequence[Sequence[int]] | None = None
) -> list[tuple[list[int], int]]:
    """Group sample indices so each micro-batch's forward cost fits ``budget`` (a longer sample goes alone).

    Longest first, so rows of similar length share a batch and padding stays
    small. Without ``rows`` the cost is rows x longest row; with what each
    sample may share (its token ids up to its first trained logit) a common
    prefix counts once (see ``batch_cost``). Returns (indices, shared prefix
    to compute once, 0 for none) per micro-batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    shared: list[int] = []  # per batch: the common prefix of its rows
    for i in order:
        if batches:
            candidate = batches[-1] + [i]
            common = min(shared[-1], common_prefix_length([rows[batches[-1][0]], rows[i]])) if rows else 0
            if batch_cost([lengths[j] for j in candidate], common) <= budget:
                batches[-1].append(i)
                shared[-1] = common
                continue
        batches.append([i])
        shared.append(len(rows[i]) if rows else 0)
    return [(batch, usable_shared(len(batch), common)) for batch, common in zip(batches, shared)]


def plan_micro_batches(
    lengths: Sequence[int], budget: int, rows: Sequence[Sequence[int]] | None = None
) -> list[list[int]]:
    """The sample indices of each micro-batch ``pack_micro_batches`` makes."""
    return [batch for batch, _ in pack_micro_batches(lengths, budget, rows)]


def _prefix_then_rows(model: Any, ids_BT: torch.Tensor, shared: int, **prefix_kwargs: Any) -> tuple[Any, torch.Tensor]:
    """Run the shared prefix once (batch 1); its KV cache expanded to the batch, and the rows' positions."""
    prefix = model(input_ids=ids_BT[:1, :shared], use_cache=True, **prefix_kwargs)
    cache = prefix.past_key_values
    batch = ids_BT.shape[0]
    for layer in cache.layers:
        layer.keys = layer.keys.expand(batch, -1, -1, -1)
        layer.values = layer.values.expand(batch, -1, -1, -1)
    width = ids_BT.shape[1]
    return cache, torch.arange(shared, width, device=ids_BT.device).expand(batch, -1)


def shared_prefix_hidden(
    decoder: Any, ids_BT: torch.Tensor, attention_BT: torch.Tensor, shared: int, keep_K: torch.Tensor
) -> torch.Tensor:
    """The decoder's last hidden states at positions ``keep_K`` (all >= ``shared``): [B, K, D]."""
    cache, positions_BS = _prefix_then_rows(decoder, ids_BT, shared)
    out = decoder(input_ids=ids_BT[:, shared:], attention_mask=attention_BT, position_ids=positions_BS,
                  past_key_values=cache, use_cache=True)
    return out.last_hidden_state[:, keep_K - shared]


def shared_prefix_logits(
    model: Any, ids_BT: torch.Tensor, attention_BT: torch.Tensor, shared: int, keep_K: torch.Tensor,
    supports_logits_to_keep: bool,
) -> torch.Tensor:
    """Logits at positions ``keep_K`` (all >= ``shared``) of rows whose first ``shared`` tokens are equal."""
    cache, positions_BS = _prefix_then_rows(
        model, ids_BT, shared, **({"logits_to_keep": 1} if supports_logits_to_keep else {}))
    rest_K = keep_K - shared
    kwargs = {"logits_to_keep": rest_K} if supports_logits_to_keep else {}
    out = model(input_ids=ids_BT[:, shared:], attention_mask=attention_BT, position_ids=positions_BS,
                past_key_values=cache, use_cache=True, **kwargs)
    return out.logits if supports_logits_to_keep else out.logits[:, rest_K]


def can_share_prefix(model: Any) -> bool:
    """Whether ``model``'s KV cache is plain per-layer keys and values (no sliding windows, no state)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return plain_kv_cache(base)


__all__ = ["MIN_SHARED_TOKENS", "batch_cost", "can_share_prefix", "common_prefix_length", "pack_micro_batches",
           "plan_micro_batches", "shared_prefix_hidden", "shared_prefix_logits", "usable_shared"]
