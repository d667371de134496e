"""The rows that decode together: one left-padded KV cache, its attention mask, next-token logits.

Rows join between decode steps (continuous batching): new prompts are
prefilled in their own forward pass, then both caches are left-padded to
one length and concatenated along the batch. Finished rows leave by index
selection, and columns that became padding for every row are cropped.
Each row's position ids count only its real tokens, so a row's logits are
those of an unpadded forward pass of its own tokens.

A row may start from reused KV (a cached prompt prefix): its prefix sits
left-padded in the first columns and its left-padded rest after them, so
the mask can have holes between a row's prefix and its suffix. Merging,
decoding and cropping only look at the mask, so holes cost columns, never
correctness.

Rows whose prompts open with the same tokens (an agent's system prompt)
hold that common prefix once (``_shared_prefix``): ``prefixes`` hold its
KV (one per variant: rows decoding with the adapter, rows decoding the base
model), each user's cache holds its columns after it, and the mask covers
only those. Rows joining a batch use its prefix of their variant where they
begin with it (it may be cut shorter, its tail moved into the users' own
columns).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ...torch_support import cache_of
from ._kv_buffer import KV_CACHES, mergeable, reserve_columns
from ._lora_fold import ACTIVE, BASE
from ._prefix_cache import KV
from ._sampling import RowSampling
from ._shared_prefix import (SHARED_PREFIX_KWARG, HeldPrefixes, SharedPrefix, choose_shared, cut_shared,
                             drop_leading_columns, leading_columns, plan_join, with_shared_prefix)


@dataclass
class Row:
    """One request being decoded: its prompt, what it produced so far, and how to pick tokens."""

    job: Any  # the engine's handle for the caller (opaque here)
    prompt_ids: tuple[int, ...]
    sampling: RowSampling
    max_new: int  # max_tokens, capped by the model's context
    stop: tuple[str, ...]
    policy_version: int = 0  # the version in effect at prefill (the first token's)
    logits_version: int = 0  # the version of the forward pass that computed the row's next-token logits
    # the weights it decodes with (``_lora_fold.ACTIVE``: the adapter served now; ``BASE``: the adapter switched off,
    # ``GenerationRequest.base_model``; a role's name: that role's adapter, ``GenerationRequest.role``)
    variant: str = ACTIVE
    cache_epoch: int = 0  # the prefix cache's epoch at prefill: its KV may be stored only while it holds
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)  # the version that produced each completion id
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)

    @property
    def next_position(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def base(self) -> bool:
        return self.variant == BASE


class DecodeBatch:
    """Rows sharing forward passes. ``logits_BV`` holds each row's next-token logits; ``prefixes`` the KV of
    first tokens rows have in common, held once (at most one per variant: the adapter's rows, the base
    model's), their users' caches starting after them."""

    def __init__(self, rows: list[Row], cache: Any, mask_BL: torch.Tensor, logits_BV: torch.Tensor) -> None:
        self.rows = rows
        self.cache = cache
        self.mask_BL = mask_BL
        self.logits_BV = logits_BV
        self.prefixes: list[SharedPrefix] = []
        self.sharing = False  # whether rows' common prefixes are held once (set by prefill's share_prefix)

    @classmethod
    def prefill(
        cls, model: Any, rows: list[Row], pad_id: int, device: torch.device, prefixes: Sequence[KV | None] = (),
        kv_cache: str = "preallocated", share_prefix: bool = False,
    ) -> "DecodeBatch":
        """Run the prompts of ``rows`` through ``model``; ``prefixes[b]`` (optional) is reused KV of row b's
        first prompt tokens, and only the tokens after it are fed. ``kv_cache`` names how the batch then holds
        its KV (``_kv_buffer.KV_CACHES``: preallocated buffers, or transformers' per-step concatenation).
        ``share_prefix``: hold the prompts' common prefixes once (``_shared_prefix``; the model's attention
        must be ``_attention.short_query_attention``, which reads them)."""
        cache, mask_BL, logits_BV = forward_prompts(model, [r.prompt_ids for r in rows], pad_id, device, prefixes)
        batch = cls(rows, cache, mask_BL, logits_BV)
        batch.sharing = share_prefix and batch.can_merge()
        if batch.sharing:
            batch.mask_BL = batch._share_among(batch, 0, [0] * len(rows))
        batch.cache = KV_CACHES[kv_cache](cache)
        return batch

    def _share_among(self, source: "DecodeBatch", offset: int, drops: list[int]) -> torch.Tensor:
        """For each variant of ``source``'s rows that holds no prefix yet: hold the stretch most of those rows
        begin with (``choose_shared``) as a new prefix; its users are those rows, at ``offset`` in this batch.
        Returns ``source``'s mask with the users' leading columns dropped (``drops`` per source row, added to)."""
        held = {p.variant for p in self.prefixes}
        for variant in sorted({r.variant for r in source.rows}):
            if variant in held:
                continue
            index = [b for b, r in enumerate(source.rows) if r.variant == variant]
            choice = choose_shared([source.rows[b].prompt_ids for b in index]) if index else None
            if choice is None:
                continue
            members, n = [index[m] for m in choice[0]], choice[1]
            users_B = torch.zeros(offset + len(source.rows), dtype=torch.bool, device=self.mask_BL.device)
            users_B[[offset + m for m in members]] = True
            kv = leading_columns(source.cache, source.mask_BL, members[0], n)
            self.prefixes.append(SharedPrefix(source.rows[members[0]].prompt_ids[:n], kv, users_B, variant))
            for m in members:
                drops[m] = n
        return drop_leading_columns(source.cache, source.mask_BL, drops)

    def base_rows_B(self) -> torch.Tensor | None:
        """Which rows decode without the adapter (bool per row), or None when none does."""
        if not any(r.base for r in self.rows):
            return None
        return torch.tensor([r.base for r in self.rows], dtype=torch.bool, device=self.mask_BL.device)

    def variants_B(self) -> list[str] | None:
        """Each row's variant (``Row.variant``), or None when every row decodes with the adapter served now."""
        if all(r.variant == ACTIVE for r in self.rows):
            return None
        return [r.variant for r in self.rows]

    def decode(self, model: Any, tokens_B: list[int]) -> None:
        """Feed one new token per row; ``logits_BV`` becomes the logits after it."""
        device = self.mask_BL.device
        ids_B1 = torch.tensor(tokens_B, dtype=torch.long, device=device)[:, None]
        positions_B1 = torch.tensor([r.next_position - 1 for r in self.rows], device=device)[:, None]
        self.mask_BL = F.pad(self.mask_BL, (0, 1), value=1)
        width = reserve_columns(self.cache, 1)  # a padded cache's attention reads its whole buffer
        mask_BW = self.mask_BL if width is None else F.pad(self.mask_BL, (0, width - self.mask_BL.shape[1]))
        held = HeldPrefixes(self.prefixes) if self.prefixes else None
        if held is not None:
            held.prepare(self.logits_BV.dtype if self.logits_BV.is_floating_point() else torch.float32)
        out = model(
            input_ids=ids_B1,
            attention_mask=mask_BW,
            position_ids=positions_B1,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
            **({SHARED_PREFIX_KWARG: held} if held is not None else {}),
        )
        if held is not None:
            held.check_used(len(self.cache.layers), model)
        self.cache = out.past_key_values
        self.logits_BV = out.logits[:, -1, :]

    def can_merge(self) -> bool:
        """Whether other rows can join this cache (only plain full-attention layers can be re-padded)."""
        return _plain_layers(self.cache)

    def merge(self, other: "DecodeBatch") -> None:
        """Append ``other``'s rows, left-padding the shorter cache so both have one length.

        Per variant, ``other``'s rows that begin with this batch's prefix of
        their variant use it (``_shared_prefix.plan_join``, which may cut it
        shorter); where this batch holds none for their variant, the one
        they have in common becomes a prefix of the merged batch."""
        for prefix in other.prefixes:  # its users take their prefix columns back; the plans below decide anew
            _, other.mask_BL = cut_shared(other.cache, other.mask_BL, prefix, 0)
        other.prefixes = []
        drops, joined = [0] * len(other.rows), {}
        for variant in sorted({r.variant for r in other.rows}):
            mine = next((i for i, p in enumerate(self.prefixes) if p.variant == variant), None)
            if mine is None:
                continue
            index = [b for b, r in enumerate(other.rows) if r.variant == variant]
            n, joining = plan_join(self.prefixes[mine], [other.rows[b].prompt_ids for b in index])
            cut, self.mask_BL = cut_shared(self.cache, self.mask_BL, self.prefixes[mine], n)
            assert cut is not None  # plan_join keeps at least MIN_SHARED_PREFIX tokens
            self.prefixes[mine] = cut
            flags = [False] * len(other.rows)
            for b, join in zip(index, joining):
                flags[b], drops[b] = join, n if join else 0
            joined[id(cut)] = flags
        existing = list(self.prefixes)
        if self.sharing:  # variants this batch holds no prefix for: what other's rows of them share
            other.mask_BL = self._share_among(other, len(self.rows), drops)
        else:
            other.mask_BL = drop_leading_columns(other.cache, other.mask_BL, drops)
        for prefix in existing:
            flags = joined.get(id(prefix), [False] * len(other.rows))
            prefix.users_B = torch.cat([prefix.users_B, torch.tensor(flags, dtype=torch.bool,
                                                                     device=self.mask_BL.device)])
        length = max(self.mask_BL.shape[1], other.mask_BL.shape[1])
        for mine_layer, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine_layer.keys = torch.cat([_left_pad(mine_layer.keys, length), _left_pad(theirs.keys, length)])
            mine_layer.values = torch.cat([_left_pad(mine_layer.values, length), _left_pad(theirs.values, length)])
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
        for prefix in self.prefixes:
            prefix.users_B = prefix.users_B[index_K]
        self.prefixes = [p for p in self.prefixes if bool(p.users_B.any())]  # a prefix goes with its last user
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

    def prefix_of(self, b: int) -> SharedPrefix | None:
        """The shared prefix row ``b`` begins with, if it uses one."""
        return next((p for p in self.prefixes if bool(p.users_B[b])), None)

    def row_states(self, b: int, start: int = 0) -> KV:
        """Row ``b``'s KV from its ``start``-th token on, per layer [1, H, n, D] (padding and holes dropped)."""
        prefix = self.prefix_of(b)
        if prefix is None:
            return row_states(self.cache, self.mask_BL, b, start)
        own = row_states(self.cache, self.mask_BL, b, max(0, start - prefix.length))
        return with_shared_prefix(prefix, own, start)


def forward_prompts(
    model: Any, prompts: Sequence[tuple[int, ...]], pad_id: int, device: torch.device,
    prefixes: Sequence[KV | None] = (),
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """One forward pass over ``prompts``; returns (cache, mask_BL, next-token logits_BV).

    Columns: each row's prefix KV left-padded to the longest prefix P, then
    its remaining prompt tokens left-padded to the longest rest S. Position
    ids continue from the row's own prefix length.
    """
    prefixes = list(prefixes) or [None] * len(prompts)
    lengths_B = [0 if p is None else p[0][0].shape[2] for p in prefixes]
    rests = [prompt[n:] for prompt, n in zip(prompts, lengths_B)]
    if min(len(r) for r in rests) < 1:
        raise ValueError("prefixes: each prefix must leave at least one prompt token to feed")
    width_P, width_S = max(lengths_B), max(len(r) for r in rests)
    ids_BS = torch.full((len(prompts), width_S), pad_id, dtype=torch.long)
    mask_BL = torch.zeros((len(prompts), width_P + width_S), dtype=torch.long)
    for b, (rest, n) in enumerate(zip(rests, lengths_B)):
        ids_BS[b, width_S - len(rest):] = torch.tensor(rest, dtype=torch.long)
        mask_BL[b, width_P - n : width_P] = 1
        mask_BL[b, width_P + width_S - len(rest):] = 1
    ids_BS, mask_BL = ids_BS.to(device), mask_BL.to(device)
    offsets_B1 = torch.tensor(lengths_B, device=device)[:, None]
    positions_BS = offsets_B1 + (mask_BL[:, width_P:].cumsum(dim=-1) - 1).clamp(min=0)
    past = _stack_prefixes(prefixes, lengths_B, width_P) if width_P else None
    out = model(input_ids=ids_BS, attention_mask=mask_BL, position_ids=positions_BS,
                past_key_values=past, use_cache=True, logits_to_keep=1)
    return out.past_key_values, mask_BL, out.logits[:, -1, :]


def row_states(cache: Any, mask_BL: torch.Tensor, b: int, start: int = 0) -> KV:
    """Row ``b``'s real columns of ``cache`` from its ``start``-th real token on, per layer [1, H, n, D]."""
    columns_N = mask_BL[b].nonzero()[start:, 0]
    return [
        (layer.keys[b : b + 1].index_select(2, columns_N), layer.values[b : b + 1].index_select(2, columns_N))
        for layer in cache.layers
    ]


def _stack_prefixes(prefixes: Sequence[KV | None], lengths_B: list[int], width_P: int) -> Any:
    """A cache whose row b holds ``prefixes[b]`` right-aligned in ``width_P`` columns (zeros before it).

    Rows that all share one prefix get a broadcast view (the model's first
    update copies it into the grown cache anyway).
    """
    given = next(p for p in prefixes if p is not None)
    shared = all(p is given for p in prefixes)
    layers = []
    for layer, (keys_1HPD, _) in enumerate(given):
        if shared:
            shape = (len(prefixes), *keys_1HPD.shape[1:])
            layers.append((keys_1HPD.expand(shape), given[layer][1].expand(shape)))
            continue
        shape = (len(prefixes), keys_1HPD.shape[1], width_P, keys_1HPD.shape[3])
        keys, values = keys_1HPD.new_zeros(shape), keys_1HPD.new_zeros(shape)
        for b, (prefix, n) in enumerate(zip(prefixes, lengths_B)):
            if prefix is not None:
                keys[b, :, width_P - n :] = prefix[layer][0][0]
                values[b, :, width_P - n :] = prefix[layer][1][0]
        layers.append((keys, values))
    return cache_of(layers)  # no copy: the model's update concatenates


def _plain_layers(cache: Any) -> bool:
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(mergeable(layer) for layer in layers)


def _left_pad(states_BHLD: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(states_BHLD, (0, 0, length - states_BHLD.shape[-2], 0))


def _left_pad_mask(mask_BL: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(mask_BL, (length - mask_BL.shape[1], 0))


__all__ = ["DecodeBatch", "Row", "forward_prompts", "row_states"]
