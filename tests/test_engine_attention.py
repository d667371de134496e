"""Short-query attention: the hf engine's CPU attention gives what SDPA gives, for short and long queries."""

import pytest
import torch

from mtrl_runtime.engines import HFEngine
from mtrl_runtime.engines.hf._attention import ATTENTION_NAME, SHORT_QUERY_TOKENS
from mtrl_runtime.testing import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def logits_with_cache(model, ids_BL, mask_BL, new_BQ):
    """Prefill ``ids_BL`` (left-padded by ``mask_BL``), then feed ``new_BQ``: the logits of the new tokens."""
    with torch.no_grad():
        positions = (mask_BL.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids_BL, attention_mask=mask_BL, position_ids=positions, use_cache=True)
        mask = torch.cat([mask_BL, torch.ones_like(new_BQ)], dim=1)
        start = mask_BL.sum(-1, keepdim=True)
        positions = start + torch.arange(new_BQ.shape[1])[None, :]
        return model(input_ids=new_BQ, attention_mask=mask, position_ids=positions,
                     past_key_values=out.past_key_values, use_cache=True).logits


@pytest.mark.parametrize("query_tokens", [1, 7, SHORT_QUERY_TOKENS + 9])
def test_the_engine_attention_matches_sdpa_for_padded_batches(tokenizer, query_tokens):
    sdpa = tiny_model(tokenizer, seed=3)
    ours = tiny_model(tokenizer, seed=3)
    engine = HFEngine.from_objects(ours, tokenizer)  # selects the short-query attention on CPU
    assert ours.config._attn_implementation == ATTENTION_NAME and sdpa.config._attn_implementation == "sdpa"
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (3, 90), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :30] = 0  # left padding on two rows: the mask is never empty
    mask[2, :5] = 0
    new = torch.randint(5, 200, (3, query_tokens), generator=gen)
    expected = logits_with_cache(sdpa, ids, mask, new)
    got = logits_with_cache(ours, ids, mask, new)
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
    del engine


@pytest.mark.parametrize("query_tokens", [1, 5])
def test_grouped_attention_equals_attention_over_repeated_kv_heads(query_tokens):
    from transformers.models.llama.modeling_llama import repeat_kv

    from mtrl_runtime.engines.hf._attention import grouped_matmul_attention

    gen = torch.Generator().manual_seed(1)
    B, H, K, L, D = 2, 9, 3, 11, 8  # SmolLM2's 3 query heads per KV head
    query = torch.randn(B, H, query_tokens, D, generator=gen)
    key, value = torch.randn(B, K, L, D, generator=gen), torch.randn(B, K, L, D, generator=gen)
    mask = torch.zeros(B, 1, query_tokens, L)
    mask[0, :, :, :4] = float("-inf")  # row 0 is left-padded by 4
    out, weights = grouped_matmul_attention(query, key, value, mask, scaling=D ** -0.5)

    scores = query @ repeat_kv(key, H // K).transpose(2, 3) * D ** -0.5 + mask
    expected_weights = scores.softmax(-1)
    expected = (expected_weights @ repeat_kv(value, H // K)).transpose(1, 2)
    assert out.shape == (B, query_tokens, H, D)
    assert torch.allclose(weights, expected_weights, atol=1e-6)
    assert torch.allclose(out, expected, atol=1e-6)
    assert float(weights[0, :, :, :4].abs().max()) == 0.0


def test_training_through_small_matmul_attention_gives_sdpa_gradients(tokenizer):
    """Training forward + backward on right-padded rows: the same loss and LoRA-free weight gradients."""
    from mtrl_runtime.engines.hf._attention import SMALL_ATTENTION_POSITIONS

    sdpa = tiny_model(tokenizer, seed=5)
    ours = tiny_model(tokenizer, seed=5)
    HFEngine.from_objects(ours, tokenizer)  # selects the engine's attention on the shared model
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 200, (4, 40), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 31:] = 0  # right padding, as the trainer's micro-batches have
    mask[3, 20:] = 0
    assert 4 * 40 * 40 <= SMALL_ATTENTION_POSITIONS  # this batch takes the matmul path
    grads = []
    for model in (sdpa, ours):
        model.train()
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if "layers.0.self_attn" in n})
        model.eval()
    for name, expected in grads[0].items():
        assert torch.allclose(grads[1][name], expected, atol=1e-5, rtol=1e-4), name
