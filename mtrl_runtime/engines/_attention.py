"""Attention for CPU decoding: plain matmul attention for short queries, SDPA for long ones.

With a padding mask (a batch of rows always has one), SDPA on CPU takes its
generic path, which costs far more than two matmuls when the query is a
single token: measured on SmolLM2-135M, 8 rows at 1,600 tokens of context,
one decode step took 448 ms with SDPA and 174 ms with matmul attention in
bf16 (642 vs 450 ms in fp32). Long queries (prefill of a whole prompt, the
trainer's forward passes) keep SDPA and its mask, unchanged.

``use_short_query_attention(model)`` registers the pair (mask builder and
attention function) with transformers under ``ATTENTION_NAME`` and selects
it on the model; the choice is made per call from the query length, so a
model shared with a trainer behaves as before for the trainer's sequences.
"""

from __future__ import annotations

from typing import Any

ATTENTION_NAME = "mtrl_short_query"
SHORT_QUERY_TOKENS = 64  # queries up to this length use matmul attention


def short_query_mask(batch_size: int, q_length: int, kv_length: int, **kwargs: Any) -> Any:
    """An additive float mask for short queries (what matmul attention adds), SDPA's own otherwise."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    build = eager_mask if q_length <= SHORT_QUERY_TOKENS else sdpa_mask
    return build(batch_size=batch_size, q_length=q_length, kv_length=kv_length, **kwargs)


def short_query_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """Matmul attention for a query of up to ``SHORT_QUERY_TOKENS`` tokens, SDPA for longer ones."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.llama.modeling_llama import eager_attention_forward

    if query.shape[-2] <= SHORT_QUERY_TOKENS:
        kwargs.pop("is_causal", None)
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def use_short_query_attention(model: Any) -> bool:
    """Select the short-query attention on ``model`` when it runs on CPU with SDPA; returns whether it did."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    AttentionInterface.register(ATTENTION_NAME, short_query_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, short_query_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return True


__all__ = ["ATTENTION_NAME", "SHORT_QUERY_TOKENS", "short_query_attention", "short_query_mask", "use_short_query_attention"]
