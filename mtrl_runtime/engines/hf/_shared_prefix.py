"""Rows that begin with the same tokens: their common prefix's KV held once and attended as one matrix.

The rows of a decode batch usually open with the same tokens: the agent's
system prompt and tool definitions (in the aircraft example ~1,500 of the
~2,000 tokens of context every row decodes at). Held per row, that prefix
is read once per row at every decode step, and at long context that read
is most of a step's attention. A batch instead keeps it once
(``SharedPrefix``: per layer [1, K, P, D]) and each row that begins with it
(a "user") holds only its columns after it. ``shared_prefix_attention``
scores all rows' queries against the shared keys in one matrix product per
KV head (B x G query rows at once, where per-row attention multiplies one
row's G at a time against its own copy), scores each row's own columns as
before, and takes one softmax over both: the same function of the same
keys and values as attention over the whole row, summed in another order.
Rows that do not begin with the prefix keep all their columns and have the
prefix masked out.

Which prefixes a batch shares, and who uses them (``DecodeBatch`` applies these):

- a batch holds at most one prefix per variant: rows decoding with the
  adapter, and rows decoding the base model with it switched off
  (``GenerationRequest.base_model``), whose KV differs; a row attends to
  its variant's prefix only, so with two prefixes each one's scores are
  computed for its users' queries alone;
- a new batch shares, per variant, the longest stretch that the largest
  group of its rows opens with (``choose_shared``: most columns saved);
- a row that joins a running batch uses its variant's prefix when its
  prompt begins with it; when joining rows share only the first part of
  it, the prefix is cut to that part (its tail moved into the users' own
  columns) if that saves more columns than leaving them out
  (``plan_join``); a variant without a prefix takes the one its joining
  rows have in common;
- rows leave as before; when the last user of a prefix leaves, it goes.

The model reaches the shared prefix through a keyword argument of its
forward call (``SHARED_PREFIX_KWARG``), which transformers passes down to
the attention function; only ``_attention.short_query_attention`` reads
it. Each layer that used it ticks ``HeldPrefixes.layers_used``: a forward
pass that left a layer's prefix unread (a model class that does not pass
its keyword arguments down) would have computed attention without the
prefix, so ``check_used`` raises instead of letting such logits through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ._lora_fold import ACTIVE
from ._prefix_cache import KV, common_length

SHARED_PREFIX_KWARG = "mtrl_shared_prefix"  # the model forward's keyword that carries a SharedPrefix to attention
MIN_SHARED_PREFIX = 32  # a common stretch shorter than this stays in the rows' own columns


@dataclass(eq=False)
class SharedPrefix:
    """The KV of ``ids`` (per layer [1, K, P, D]) and which rows of the batch begin with them (``users_B``)."""

    ids: tuple[int, ...]
    kv: KV
    users_B: torch.Tensor  # bool, one per row of the batch
    variant: str = ACTIVE  # the weights that computed it: only rows of that variant may use it (``Row.variant``)

    def __post_init__(self) -> None:
        lengths = {t.shape[2] for pair in self.kv for t in pair}
        if lengths != {len(self.ids)}:
            raise ValueError(f"shared prefix: {len(self.ids)} ids but KV of {sorted(lengths)} columns")

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def users(self) -> int:
        return int(self.users_B.sum())


@dataclass(eq=False)
class HeldPrefixes:
    """What one forward pass reads: the batch's shared prefixes (at most one per variant, users disjoint)."""

    items: list[SharedPrefix]
    layers_used: int = field(default=0, repr=False)  # attention layers that read them in the current pass
    bias_B: torch.Tensor | None = field(default=None, repr=False)  # one prefix: 0 for its users, min for others
    index_U: list[torch.Tensor] = field(default_factory=list, repr=False)  # several: each one's user rows

    def prepare(self, dtype: torch.dtype) -> None:
        """Before a forward pass: the masks attention applies to the prefixes' scores."""
        self.layers_used = 0
        if len(self.items) == 1:
            users_B = self.items[0].users_B
            self.bias_B = None if bool(users_B.all()) else torch.zeros(
                users_B.shape, dtype=dtype, device=users_B.device).masked_fill(~users_B, torch.finfo(dtype).min)
        else:
            self.index_U = [p.users_B.nonzero()[:, 0] for p in self.items]

    def check_used(self, layers: int, model: Any) -> None:
        """Raise unless each of the model's ``layers`` attention layers read the prefixes in the last pass."""
        used, self.layers_used = self.layers_used, 0
        if used != layers:
            raise RuntimeError(
                f"shared-prefix decoding: {used} of {layers} attention layers of {type(model).__name__} read the "
                f"shared prefix (its forward does not pass {SHARED_PREFIX_KWARG!r} down to attention), so this "
                "pass's logits are wrong; serve this model with engine_options.share_prefix: false"
            )


def shared_prefix_attention(
    query_BHQD: torch.Tensor, key_BKSD: torch.Tensor, value_BKSD: torch.Tensor, mask_B1QS: torch.Tensor | None,
    scaling: float, held: HeldPrefixes, layer: int,
) -> torch.Tensor:
    """Attention over each row's shared prefix of layer ``layer`` (if it has one) followed by its own columns.

    Query head h uses KV head h // G (G = H / K), as ``repeat_kv`` orders
    them; ``mask_B1QS`` covers the own columns, a prefix is visible to its
    users only. Returns [B, Q, H, D].
    """
    B, H, Q, D = query_BHQD.shape
    K, S = key_BKSD.shape[1], key_BKSD.shape[2]
    N = H // K * Q  # query rows per (row, KV head): (head in group, query position)
    query_BKND = (query_BHQD * scaling).reshape(B, K, N, D)
    own_BKNS = torch.matmul(query_BKND, key_BKSD.transpose(2, 3))
    if mask_B1QS is not None:
        mask = mask_B1QS[:, :, :, :S].unsqueeze(2)  # [B, 1, 1, Q, S]: the same for every head
        own_BKNS = (own_BKNS.view(B, K, N // Q, Q, S) + mask).view(B, K, N, S)
    if len(held.items) == 1:
        return _one_prefix(query_BKND, own_BKNS, value_BKSD, held, layer).reshape(B, H, Q, D).transpose(1, 2) \
            .contiguous()
    total = sum(p.length for p in held.items)
    scores_BKNL = own_BKNS.new_full((B, K, N, total + S), torch.finfo(own_BKNS.dtype).min)
    offset = 0
    for prefix, index_U in zip(held.items, held.index_U, strict=True):  # each prefix: its users' queries only
        keys_1KPD = prefix.kv[layer][0]
        U, P = len(index_U), prefix.length
        query_KMD = query_BKND.index_select(0, index_U).transpose(0, 1).reshape(K, U * N, D)
        scores_BKNL[index_U, :, :, offset:offset + P] = \
            torch.matmul(query_KMD, keys_1KPD[0].transpose(1, 2)).view(K, U, N, P).transpose(0, 1)
        offset += P
    scores_BKNL[..., total:] = own_BKNS
    weights_BKNL = torch.softmax(scores_BKNL, dim=-1, dtype=torch.float32).to(query_BKND.dtype)
    out_BKND = torch.matmul(weights_BKNL[..., total:], value_BKSD)
    offset = 0
    for prefix, index_U in zip(held.items, held.index_U, strict=True):
        values_1KPD = prefix.kv[layer][1]
        U, P = len(index_U), prefix.length
        weights_KMP = weights_BKNL.index_select(0, index_U)[..., offset:offset + P].transpose(0, 1) \
            .reshape(K, U * N, P)
        out_BKND.index_add_(0, index_U, torch.matmul(weights_KMP, values_1KPD[0]).view(K, U, N, D).transpose(0, 1))
        offset += P
    return out_BKND.reshape(B, H, Q, D).transpose(1, 2).contiguous()


def _one_prefix(query_BKND: torch.Tensor, own_BKNS: torch.Tensor, value_BKSD: torch.Tensor, held: HeldPrefixes,
                layer: int) -> torch.Tensor:
    """The common case, one prefix: every row's queries against it in one product per KV head; [B, K, N, D]."""
    B, K, N, D = query_BKND.shape
    prefix_keys_1KPD, prefix_values_1KPD = held.items[0].kv[layer]
    P = prefix_keys_1KPD.shape[2]
    query_KMD = query_BKND.transpose(0, 1).reshape(K, B * N, D)
    shared_KBNP = torch.matmul(query_KMD, prefix_keys_1KPD[0].transpose(1, 2)).view(K, B, N, P)
    if held.bias_B is not None:
        shared_KBNP = shared_KBNP + held.bias_B[None, :, None, None]
    scores_KBNL = torch.cat([shared_KBNP, own_BKNS.transpose(0, 1)], dim=-1)
    weights_KBNL = torch.softmax(scores_KBNL, dim=-1, dtype=torch.float32).to(query_BKND.dtype)
    shared_out_KMD = torch.matmul(weights_KBNL[..., :P].reshape(K, B * N, P), prefix_values_1KPD[0])
    out_BKND = torch.matmul(weights_KBNL[..., P:].transpose(0, 1), value_BKSD)
    return out_BKND + shared_out_KMD.view(K, B, N, D).transpose(0, 1)


def choose_shared(prompts: Sequence[tuple[int, ...]]) -> tuple[list[int], int] | None:
    """The rows and length of the stretch that saves most columns held once: (members, n), or None.

    Prompts sorted, neighbours sharing at least ``MIN_SHARED_PREFIX``
    tokens form a group whose stretch is their common prefix; a group saves
    (members - 1) x stretch. Every member keeps at least its last prompt
    token. A lone row shares its prompt (nothing saved until others join).
    """
    if len(prompts) == 1:
        n = len(prompts[0]) - 1
        return ([0], n) if n >= MIN_SHARED_PREFIX else None
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    best: tuple[list[int], int] | None = None
    members, common = [order[0]], len(prompts[order[0]]) - 1
    for nxt in [*order[1:], None]:
        shared = -1 if nxt is None else min(common, common_length(prompts[members[-1]], prompts[nxt]),
                                             len(prompts[nxt]) - 1)
        if shared >= MIN_SHARED_PREFIX:
            members.append(nxt)
            common = shared
            continue
        if len(members) >= 2 and common >= MIN_SHARED_PREFIX and (
                best is None or (len(members) - 1) * common > (len(best[0]) - 1) * best[1]):
            best = (sorted(members), common)
        if nxt is not None:
            members, common = [nxt], len(prompts[nxt]) - 1
    return best


def plan_join(shared: SharedPrefix, prompts: Sequence[tuple[int, ...]]) -> tuple[int, list[bool]]:
    """For rows (of the prefix's variant) joining a batch that shares ``shared``: the prefix length to keep and
    which rows use it.

    Either the prefix stays whole (rows beginning with all of it join its
    users) or it is cut to what more rows share (at least
    ``MIN_SHARED_PREFIX``), whichever saves more columns.
    """
    reach = [min(common_length(p, shared.ids), len(p) - 1) for p in prompts]
    users = shared.users
    whole = [r >= shared.length for r in reach]
    best = ((users + sum(whole) - 1) * shared.length, shared.length, whole)
    cut = min((r for r in reach if r >= MIN_SHARED_PREFIX), default=0)
    if cut and cut < shared.length:
        joining = [r >= cut for r in reach]
        saved = (users + sum(joining) - 1) * cut
        if saved > best[0]:
            best = (saved, cut, joining)
    return best[1], best[2]


def leading_columns(cache: Any, mask_BL: torch.Tensor, b: int, n: int) -> KV:
    """Row ``b``'s first ``n`` real columns, per layer [1, K, n, D] (new tensors)."""
    columns_N = mask_BL[b].nonzero()[:n, 0]
    return [(layer.keys[b : b + 1].index_select(2, columns_N), layer.values[b : b + 1].index_select(2, columns_N))
            for layer in cache.layers]


def drop_leading_columns(cache: Any, mask_BL: torch.Tensor, drop_B: Sequence[int]) -> torch.Tensor:
    """Remove each row's first ``drop_B[b]`` real columns from every cache layer; returns the new mask.

    The rows' remaining columns are gathered, left-padded to one width.
    """
    if not any(drop_B):
        return mask_BL
    kept = [mask_BL[b].nonzero()[n:, 0] for b, n in enumerate(drop_B)]
    width = max(len(c) for c in kept)
    index_BS = torch.zeros((len(kept), width), dtype=torch.long, device=mask_BL.device)
    mask = torch.zeros((len(kept), width), dtype=mask_BL.dtype, device=mask_BL.device)
    for b, c in enumerate(kept):
        index_BS[b, width - len(c):] = c
        mask[b, width - len(c):] = 1
    for layer in cache.layers:
        layer.keys, layer.values = _gather_columns(layer.keys, index_BS), _gather_columns(layer.values, index_BS)
    return mask


def cut_shared(cache: Any, mask_BL: torch.Tensor, shared: SharedPrefix, n: int,
               ) -> tuple[SharedPrefix | None, torch.Tensor]:
    """Keep the first ``n`` tokens of ``shared``; its tail moves into every user's own columns.

    The tail is placed before each row's columns (for a user its tokens
    come first; padding may then sit between, a hole the mask covers);
    other rows get it masked off. ``n`` below ``MIN_SHARED_PREFIX`` moves
    everything and returns None for the prefix.
    """
    start = n if n >= MIN_SHARED_PREFIX else 0
    if start == shared.length:
        return shared, mask_BL
    rows = mask_BL.shape[0]
    for layer, (keys, values) in zip(cache.layers, shared.kv, strict=True):
        layer.keys = torch.cat([keys[:, :, start:].expand(rows, -1, -1, -1), layer.keys], dim=2)
        layer.values = torch.cat([values[:, :, start:].expand(rows, -1, -1, -1), layer.values], dim=2)
    tail_mask = shared.users_B.to(mask_BL.dtype)[:, None].expand(rows, shared.length - start)
    mask_BL = torch.cat([tail_mask, mask_BL], dim=1)
    if not start:
        return None, mask_BL
    kept = SharedPrefix(shared.ids[:start], [(k[:, :, :start], v[:, :, :start]) for k, v in shared.kv],
                        shared.users_B, shared.variant)
    return kept, mask_BL


def with_shared_prefix(shared: SharedPrefix, own: KV, start: int) -> KV:
    """A user row's KV from its ``start``-th token: the shared prefix's columns from there, then ``own`` (the
    row's columns after the prefix, from ``max(0, start - P)``)."""
    if start >= shared.length:
        return own
    return [(torch.cat([k[:, :, start:], ok], dim=2), torch.cat([v[:, :, start:], ov], dim=2))
            for (k, v), (ok, ov) in zip(shared.kv, own, strict=True)]


def _gather_columns(states_BKLD: torch.Tensor, index_BS: torch.Tensor) -> torch.Tensor:
    B, K, _, D = states_BKLD.shape
    return states_BKLD.gather(2, index_BS[:, None, :, None].expand(B, K, index_BS.shape[1], D))


__all__ = [
    "MIN_SHARED_PREFIX",
    "SHARED_PREFIX_KWARG",
    "HeldPrefixes",
    "SharedPrefix",
    "choose_shared",
    "cut_shared",
    "drop_leading_columns",
    "leading_columns",
    "plan_join",
    "shared_prefix_attention",
    "with_shared_prefix",
]
