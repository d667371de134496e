"""Prefill with prefix reuse: where each new row starts from, what is computed once, what is stored after.

For the rows of one admission:

1. each row looks up the longest stretch of its prompt held in the cache (``PrefixCache.lookup``);
2. rows starting from the same point (the same stored prefix, or none) that
   share at least ``min_shared`` more tokens have that common stretch
   computed once (one row per stretch, all stretches in one pass) and stored;
3. one pass feeds every row only the tokens after its prefix;
4. every row's whole prompt is stored, so a later request extending it hits.

When a row finishes, ``store_finished`` stores its prompt + completion (less
the last sampled token, never fed), so the next turn of that conversation
prefills only its new tokens. Every store carries the row's cache epoch: KV
computed before a weight change is refused.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Any, Sequence

import torch

from .._stats import EngineStats
from ._decoding import DecodeBatch, Row, forward_prompts, row_states
from ._prefix_cache import KV, PrefixCache, PrefixEntry, common_length

MIN_SHARED_TOKENS = 32  # a common stretch shorter than this is cheaper to recompute than to split out


def prefill_rows(
    model: Any, rows: list[Row], cache: PrefixCache | None, pad_id: int, device: torch.device, stats: EngineStats,
    min_shared: int = MIN_SHARED_TOKENS, kv_cache: str = "preallocated", share_prefix: bool = False,
) -> DecodeBatch:
    """Prefill ``rows`` reusing stored and shared prefixes (see the module docstring); the cache may be None.

    ``kv_cache``, ``share_prefix``: how the returned batch holds its KV (``DecodeBatch.prefill``)."""
    prefixes: list[KV | None] = [None] * len(rows)
    if cache is not None:
        starts = [cache.lookup(row.prompt_ids) for row in rows]
        _share_common_stretches(model, cache, rows, starts, prefixes, pad_id, device, stats, min_shared)
    batch = DecodeBatch.prefill(model, rows, pad_id, device, prefixes, kv_cache, share_prefix)
    for row, prefix in zip(rows, prefixes):
        reused = 0 if prefix is None else prefix[0][0].shape[2]
        stats.prompt_tokens += len(row.prompt_ids)
        stats.prefix_hit_tokens += reused
        stats.prefill_tokens += len(row.prompt_ids) - reused
    if cache is not None:
        for b, row in enumerate(rows):
            cache.store_from(row.prompt_ids, partial(batch.row_states, b), epoch=row.cache_epoch)
    return batch


def store_finished(cache: PrefixCache | None, batch: DecodeBatch, b: int) -> bool:
    """Store row ``b``'s prompt + completion KV (its last sampled token was never fed)."""
    row = batch.rows[b]
    if cache is None or len(row.completion_ids) < 2:
        return False
    ids = row.prompt_ids + tuple(row.completion_ids[:-1])
    return cache.store_from(ids, partial(batch.row_states, b), epoch=row.cache_epoch)


def shared_groups(prompts: Sequence[tuple[int, ...]], min_length: int) -> list[tuple[list[int], int]]:
    """Groups of >= 2 prompts sharing a first stretch of >= ``min_length`` tokens: (indices, stretch length).

    Prompts are sorted, and neighbours whose common prefix reaches
    ``min_length`` join one group; its stretch is the group's common prefix,
    cut so every member keeps at least one token to feed.
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    groups: list[tuple[list[int], int]] = []
    members, common = [order[0]] if order else [], len(prompts[order[0]]) if order else 0
    for prev, nxt in zip(order, order[1:]):
        shared = min(common, common_length(prompts[prev], prompts[nxt]))
        if shared >= min_length:
            members.append(nxt)
            common = shared
            continue
        groups.append((members, common))
        members, common = [nxt], len(prompts[nxt])
    if members:
        groups.append((members, common))
    out = []
    for members, common in groups:
        length = min(common, min(len(prompts[i]) for i in members) - 1)
        if len(members) >= 2 and length >= min_length:
            out.append((sorted(members), length))
    return out


def _share_common_stretches(
    model: Any, cache: PrefixCache, rows: list[Row], starts: list[tuple[PrefixEntry, int] | None],
    prefixes: list[KV | None], pad_id: int, device: torch.device, stats: EngineStats, min_shared: int,
) -> None:
    """Fill ``prefixes``: stored prefixes, extended once per group of rows sharing a longer stretch."""
    by_start: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b, start in enumerate(starts):
        by_start[(0, 0) if start is None else (id(start[0]), start[1])].append(b)
    stretches: list[tuple[tuple[int, ...], KV | None, list[int]]] = []  # (ids, KV they start from, rows)
    for members in by_start.values():
        start = starts[members[0]]
        base = None if start is None else start[0].states(start[1])
        for b in members:
            prefixes[b] = base
        base_n = 0 if start is None else start[1]
        for group, length in shared_groups([rows[b].prompt_ids for b in members], base_n + min_shared):
            stretches.append((rows[members[group[0]]].prompt_ids[:length], base, [members[g] for g in group]))
    if not stretches:
        return
    kv_cache, mask_BL, _ = forward_prompts(model, [ids for ids, _, _ in stretches], pad_id, device,
                                           [base for _, base, _ in stretches])
    for s, (ids, base, group) in enumerate(stretches):
        stats.prefill_tokens += len(ids) - (0 if base is None else base[0][0].shape[2])
        states = row_states(kv_cache, mask_BL, s)
        epoch = rows[group[0]].cache_epoch
        cache.store(ids, states, epoch=epoch)
        for b in group:
            prefixes[b] = states


__all__ = ["MIN_SHARED_TOKENS", "prefill_rows", "shared_groups", "store_finished"]
