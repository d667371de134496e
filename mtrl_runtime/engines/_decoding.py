"""The rows that decode together: one left-padded KV cache, its attention mask, next-token logits.

Rows join between decode steps (continuous batching): new prompts are
prefilled in their own forward pass, then both caches are left-padded to
one length and concatenated along the batch. Finished rows leave by index
selection, and columns that became padding for every row are cropped.
Each row's position ids count only its real tokens, so a row's logits are
those of an unpadded forward pass of its own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ._sampling import RowSampling


@dataclass
class Row:
    """One request being decoded: its prompt, what it produced so far, and how to pick tokens."""

    job: Any  # the engine's handle for the caller (opaque here)
    prompt_ids: tuple[int, ...]
    sampling: RowSampling
    max_new: int  # max_tokens, capped by the model's context
    stop: tuple[str, ...]
    policy_version: int = 0
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)

    @property
    def next_position(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


class DecodeBatch:
    """Rows sharing forward passes. ``logits_BV`` holds each row's next-token logits."""

    def __init__(self, rows: list[Row], cache: Any, mask_BL: torch.Tensor, logits_BV: torch.Tensor) -> None:
        self.rows = rows
        self.cache = cache
        self.mask_BL = mask_BL
        self.logits_BV = logits_BV

    @classmethod
    def prefill(cls, model: Any, rows: list[Row], pad_id: int, device: torch.device) -> "DecodeBatch":
        """Run the prompts of ``rows`` (left-padded to one length) through ``model``."""
        length = max(len(r.prompt_ids) for r in rows)
        ids_BL = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask_BL = torch.zeros((len(rows), length), dtype=torch.long)
        for b, row in enumerate(rows):
            ids_BL[b, length - len(row.prompt_ids):] = torch.tensor(row.prompt_ids, dtype=torch.long)
            mask_BL[b, length - len(row.prompt_ids):] = 1
        ids_BL, mask_BL = ids_BL.to(device), mask_BL.to(device)
        positions_BL = (mask_BL.cumsum(dim=-1) - 1).clamp(min=0)
        out = model(
            input_ids=ids_BL, attention_mask=mask_BL, position_ids=positions_BL, use_cache=True, logits_to_keep=1
        )
        return cls(rows, out.past_key_values, mask_BL, out.logits[:, -1, :])

    def decode(self, model: Any, tokens_B: list[int]) -> None:
        """Feed one new token per row; ``logits_BV`` becomes the logits after it."""
        device = self.mask_BL.device
        ids_B1 = torch.tensor(tokens_B, dtype=torch.long, device=device)[:, None]
        positions_B1 = torch.tensor([r.next_position - 1 for r in self.rows], device=device)[:, None]
        self.mask_BL = F.pad(self.mask_BL, (0, 1), value=1)
        out = model(
            input_ids=ids_B1,
            attention_mask=self.mask_BL,
            position_ids=positions_B1,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = out.past_key_values
        self.logits_BV = out.logits[:, -1, :]

    def can_merge(self) -> bool:
        """Whether other rows can join this cache (only plain full-attention layers can be re-padded)."""
        layers = getattr(self.cache, "layers", None)
        return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)

    def merge(self, other: "DecodeBatch") -> None:
        """Append ``other``'s rows, left-padding the shorter cache so both have one length."""
        length = max(self.mask_BL.shape[1], other.mask_BL.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, length), _left_pad(theirs.keys, length)])
            mine.values = torch.cat([_left_pad(mine.values, length), _left_pad(theirs.values, length)])
        self.mask_BL = torch.cat([_left_pad_mask(self.mask_BL, length), _left_pad_mask(other.mask_BL, length)])
        self.logits_BV = torch.cat([self.logits_BV, other.logits_BV])
        self.rows = self.rows + other.rows

    def keep(self, indices: list[int]) -> None:
        """Keep only the rows at ``indices``; crop columns that are padding for every kept row."""
        if len(indices) == len(self.rows):
            return
        index_K = torch.tensor(indices, dtype=torch.long, device=self.mask_BL.device)
        self.rows = [self.rows[i] for i in indices]
        self.mask_BL = self.mask_BL[index_K]
        self.logits_BV = self.logits_BV[index_K]
        if not self.rows:
            return
        if not self.can_merge():
            self.cache.batch_select_indices(index_K)
            return
        first = int(self.mask_BL.any(dim=0).int().argmax())  # first column some row attends to
        self.mask_BL = self.mask_BL[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[index_K, :, first:, :]
            layer.values = layer.values[index_K, :, first:, :]


def _left_pad(states_BHLD: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(states_BHLD, (0, 0, length - states_BHLD.shape[-2], 0))


def _left_pad_mask(mask_BL: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(mask_BL, (length - mask_BL.shape[1], 0))


__all__ = ["DecodeBatch", "Row"]
