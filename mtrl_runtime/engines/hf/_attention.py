"""Attention on CPU: plain matmul attention for short queries and small batches, SDPA otherwise.

With a padding mask (a batch of rows always has one), SDPA on CPU takes its
generic path, which costs far more than two matmuls when the query is a
single token: measured on SmolLM2-135M, 8 rows at 1,600 tokens of context,
one decode step took 448 ms with SDPA and 174 ms with matmul attention in
bf16 (642 vs 450 ms in fp32). Long queries (prefill of a whole prompt, the
trainer's forward passes) keep SDPA and its mask, unless the whole score
matrix is small: SDPA's CPU kernel works in blocks sized for long
sequences, and its backward pass is slow on short ones. Forward + backward
of one SmolLM2 layer's attention in bf16 (``batch x query x key`` positions,
2 threads): 8 x 65 x 102, 3.7 ms with matmuls against 13.0 ms with SDPA;
8 x 128 x 256, 16.0 vs 21.4 ms; 4 x 256 x 512, even (27.8 vs 27.7 ms);
larger ones favour SDPA (2 x 1024 x 1024: 196 vs 85 ms). So up to
``SMALL_ATTENTION_POSITIONS`` positions matmul attention runs in training too.

The matmuls are grouped: with grouped-query attention (SmolLM2: 9 query
heads, 3 KV heads) each KV head's query heads are stacked into one matrix
and multiplied with that head's keys and values as they sit in the cache,
where transformers' eager attention first copies every KV head once per
query head (``repeat_kv``): three copies of the whole cache, per layer and
decode step.

``use_short_query_attention(model)`` registers the pair (mask builder and
attention function) with transformers under ``ATTENTION_NAME`` and selects
it on the model; the choice is made per call from the query length, so a
model shared with a trainer behaves as before for the trainer's sequences.
"""

from __future__ import annotations

from typing import Any

from ._shared_prefix import SHARED_PREFIX_KWARG, shared_prefix_attention

ATTENTION_NAME = "mtrl_short_query"
SHORT_QUERY_TOKENS = 64  # queries up to this length use matmul attention when not training
SMALL_ATTENTION_POSITIONS = 1 << 18  # batch x query x key positions up to which matmul attention always runs


def _small(batch_size: int, q_length: int, kv_length: int) -> bool:
    return batch_size * q_length * kv_length <= SMALL_ATTENTION_POSITIONS


def short_query_mask(batch_size: int, q_length: int, kv_length: int, **kwargs: Any) -> Any:
    """An additive float mask where matmul attention may run (what it adds), SDPA's own otherwise."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    matmul = q_length <= SHORT_QUERY_TOKENS or _small(batch_size, q_length, kv_length)
    build = eager_mask if matmul else sdpa_mask
    return build(batch_size=batch_size, q_length=q_length, kv_length=kv_length, **kwargs)


def grouped_matmul_attention(
    query_BHQD: Any, key_BKLD: Any, value_BKLD: Any, mask_B1QL: Any, scaling: float
) -> tuple[Any, Any]:
    """Attention by two matmuls per KV head, never expanding the KV heads.

    Query head h uses KV head h // G (G = H / K), as transformers' ``repeat_kv``
    orders them. Returns the output [B, Q, H, D] and the weights [B, H, Q, L].
    """
    import torch

    B, H, Q, D = query_BHQD.shape
    K, L = key_BKLD.shape[1], key_BKLD.shape[2]
    group = H // K
    query_BKGD = query_BHQD.reshape(B, K, group * Q, D)  # rows: (head in group, query position)
    scores_BKGL = torch.matmul(query_BKGD, key_BKLD.transpose(2, 3)) * scaling
    if mask_B1QL is not None:
        mask = mask_B1QL[:, :, :, :L].unsqueeze(2)  # [B, 1, 1, Q, L]: the same for every head
        scores_BKGL = (scores_BKGL.view(B, K, group, Q, L) + mask).view(B, K, group * Q, L)
    weights_BKGL = torch.softmax(scores_BKGL, dim=-1, dtype=torch.float32).to(query_BHQD.dtype)
    out_BKGD = torch.matmul(weights_BKGL, value_BKLD)
    out_BQHD = out_BKGD.view(B, H, Q, D).transpose(1, 2).contiguous()
    return out_BQHD, weights_BKGL.view(B, H, Q, L)


def short_query_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """Grouped matmul attention for a short query (not training) or a small score matrix, SDPA otherwise.

    A decode step of rows sharing a prompt prefix passes it as ``SHARED_PREFIX_KWARG``
    (``_shared_prefix``): this layer's part of it is attended as one matrix for all rows."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    shared = kwargs.get(SHARED_PREFIX_KWARG)
    if shared is not None:
        shared.layers_used += 1
        scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
        return shared_prefix_attention(query, key, value, attention_mask, scaling, shared, module.layer_idx), None
    batch, q_length, kv_length = query.shape[0], query.shape[-2], key.shape[-2]
    short = q_length <= SHORT_QUERY_TOKENS and not module.training
    small = _small(batch, q_length, kv_length) and attention_mask is not None and attention_mask.is_floating_point()
    if short or small:
        scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
        return grouped_matmul_attention(query, key, value, attention_mask, scaling)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def use_short_query_attention(model: Any) -> bool:
    """Select the short-query attention on ``model`` when it runs on CPU with SDPA; returns whether it did."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation == ATTENTION_NAME:
        return True  # selected before (the model served by an earlier engine)
    if implementation != "sdpa":
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    AttentionInterface.register(ATTENTION_NAME, short_query_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, short_query_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return True


__all__ = [
    "ATTENTION_NAME",
    "SHORT_QUERY_TOKENS",
    "SMALL_ATTENTION_POSITIONS",
    "grouped_matmul_attention",
    "short_query_attention",
    "short_query_mask",
    "use_short_query_attention",
]
