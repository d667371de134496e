"""Shared-prefix decoding (issue 21, decode): rows that open with the same tokens hold that prefix's KV once,
and the hf engine gives, token for token, what it gives with every row holding its own copy."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mtrl_runtime.engines import HFEngine
from mtrl_runtime.engines.hf import grouped_matmul_attention
from mtrl_runtime.engines.hf._decoding import DecodeBatch, Row
from mtrl_runtime.engines.hf._lora_fold import ACTIVE, BASE
from mtrl_runtime.engines.hf._sampling import RowSampling
from mtrl_runtime.engines.hf._shared_prefix import (MIN_SHARED_PREFIX, HeldPrefixes, SharedPrefix, choose_shared,
                                                    plan_join, shared_prefix_attention)
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.types import GenerationRequest, SamplingParams


# ---------------------------------------------------------------------- the attention on its own
def dense_reference(query, keys, values, own_mask, prefixes, scale):
    """Attention over each row's whole columns: every prefix copied into every row, masked off for non-users."""
    B = query.shape[0]
    whole_k = torch.cat([p.kv[0][0].expand(B, -1, -1, -1) for p in prefixes] + [keys], dim=2)
    whole_v = torch.cat([p.kv[0][1].expand(B, -1, -1, -1) for p in prefixes] + [values], dim=2)
    masks = [torch.where(p.users_B, 0.0, torch.finfo(torch.float32).min)[:, None, None, None].expand(B, 1, 1, p.length)
             for p in prefixes]
    out, _ = grouped_matmul_attention(query, whole_k, whole_v, torch.cat(masks + [own_mask], dim=-1), scale)
    return out


@pytest.mark.parametrize("users", [
    [[True] * 5],  # one prefix, every row a user
    [[True, True, False, True, False]],  # one prefix, two rows without one
    [[True, False, True, False, False], [False, True, False, True, False]],  # two prefixes (two variants), one row none
], ids=["every-row-a-user", "some-rows-not", "two-prefixes"])
def test_shared_prefix_attention_is_attention_over_prefix_then_own_columns(users):
    torch.manual_seed(0)
    B, H, K, D, S = 5, 6, 2, 8, 11
    query = torch.randn(B, H, 1, D)
    keys, values = torch.randn(B, K, S, D), torch.randn(B, K, S, D)
    own_mask = torch.zeros(B, 1, 1, S)
    own_mask[1, ..., :4] = torch.finfo(torch.float32).min  # left padding of one row
    prefixes = [SharedPrefix(tuple(range(P)), [(torch.randn(1, K, P, D), torch.randn(1, K, P, D))], torch.tensor(u),
                             variant=BASE if i else ACTIVE) for i, (P, u) in enumerate(zip((37, 23), users))]
    held = HeldPrefixes(prefixes)
    held.prepare(torch.float32)
    out = shared_prefix_attention(query, keys, values, own_mask, D ** -0.5, held, 0)
    expected = dense_reference(query, keys, values, own_mask, prefixes, D ** -0.5)
    assert out.shape == (B, 1, H, D)
    assert torch.allclose(out, expected, atol=1e-5), (out - expected).abs().max()


def test_a_prefix_whose_kv_does_not_match_its_ids_is_refused():
    kv = [(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))]
    with pytest.raises(ValueError, match="shared prefix: 6 ids but KV of \\[5\\] columns"):
        SharedPrefix(tuple(range(6)), kv, torch.ones(2, dtype=torch.bool))


# ---------------------------------------------------------------------- which prefix, which rows
def test_the_stretch_saving_most_columns_is_chosen():
    a, b = tuple(range(100, 140)), tuple(range(200, 300))  # 40 and 100 tokens
    prompts = [a + (1, 2), a + (3,), a + (4, 5, 6), b + (7,), b + (8, 9), tuple(range(500, 600))]
    members, n = choose_shared(prompts)
    assert (members, n) == ([3, 4], 100), "two rows x 100 tokens save 100 columns, three x 40 save 80"
    assert choose_shared([a + (1,), b + (2,)]) is None, "nothing in common"
    assert choose_shared([b]) == ([0], 99), "a lone row shares its prompt less the token it feeds"
    assert choose_shared([tuple(range(MIN_SHARED_PREFIX))]) is None


def test_joining_rows_use_the_prefix_or_cut_it_where_that_saves_more():
    ids = tuple(range(100))
    shared = SharedPrefix(ids, [(torch.zeros(1, 1, 100, 2),) * 2], torch.tensor([True, True, True]))
    n, joining = plan_join(shared, [ids + (1,), ids[:50] + (9,), (7,) * 60])
    assert (n, joining) == (100, [True, False, False]), "cut to 50: (3 + 2 - 1) x 50 < (3 + 1 - 1) x 100"
    lone = SharedPrefix(ids, [(torch.zeros(1, 1, 100, 2),) * 2], torch.tensor([True]))
    n, joining = plan_join(lone, [ids[:60] + (1,), ids[:70] + (2, 3)])
    assert (n, joining) == (60, [True, True]), "one user saves nothing whole; cut to 60 three rows save 120"


# ---------------------------------------------------------------------- the engine, sharing or not
SYSTEM_A = "system prompt alpha: follow the steps, call the tools, then answer. " * 3
SYSTEM_B = "another agent entirely, with other instructions to follow. " * 3


async def generations(share: bool, model: torch.nn.Module, tok, kv_cache: str = "concat") -> tuple[list, object]:
    """Greedy two-turn generations of six rows under two system prompts, three rows a batch: rows join and
    leave mid-decode, some begin with the running batch's prefix and some do not, turn 2 hits stored KV."""
    engine = HFEngine.from_objects(model, tok, eos_token_ids=(), max_batch_size=3, share_prefix=share,
                                   kv_cache=kv_cache)
    prompts = [tuple(tok.encode((SYSTEM_A if i % 3 else SYSTEM_B) + f"user {i} asks" + " why" * i))
               for i in range(6)]
    out = []
    try:
        for _ in range(2):
            gens = await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(
                temperature=0.0, max_tokens=20 + 7 * i, seed=i))) for i, p in enumerate(prompts)))
            out.append(gens)
            prompts = [p + g.completion_ids + tuple(tok.encode(" next")) for p, g in zip(prompts, gens)]
        assert engine.stats.joins > 0 and engine.stats.prefix_hit_tokens > 0
        return out, engine.stats
    finally:
        await engine.close()


def assert_same(plain: list, shared: list) -> None:
    for turn_plain, turn_shared in zip(plain, shared, strict=True):
        for a, b in zip(turn_plain, turn_shared, strict=True):
            assert a.completion_ids == b.completion_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5


@pytest.mark.parametrize("kv_cache", ["concat", "preallocated", "padded"])
def test_the_engine_gives_the_same_tokens_with_the_prefix_held_once(kv_cache):
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    plain, plain_stats = asyncio.run(generations(False, model, tok, kv_cache))
    shared, stats = asyncio.run(generations(True, model, tok, kv_cache))
    assert_same(plain, shared)
    assert plain_stats.shared_prefix_passes == 0
    assert stats.shared_prefix_passes > 0 and stats.shared_prefix_columns_saved > 0


def family_model(family: str, tok) -> torch.nn.Module:
    """A tiny randomly initialised model of another family (its own attention module and kwargs path)."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    else:
        model = MistralForCausalLM(MistralConfig(sliding_window=None, **common))
    return model.eval()


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_other_families_give_the_same_tokens_with_the_prefix_held_once(family):
    tok = tiny_tokenizer()
    model = family_model(family, tok)
    plain, _ = asyncio.run(generations(False, model, tok))
    shared, stats = asyncio.run(generations(True, model, tok))
    assert_same(plain, shared)
    assert stats.shared_prefix_passes > 0


def test_a_forward_pass_that_leaves_the_prefix_unread_fails_loudly():
    """A model whose attention never sees the prefix would decode as if the rows began after it."""
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    engine = HFEngine.from_objects(model, tok, eos_token_ids=())  # selects the engine's attention on the model
    prompts = [tuple(tok.encode(SYSTEM_A + f"row {i}")) for i in range(2)]
    rows = [Row(job=None, prompt_ids=p, sampling=RowSampling(0.0, 1.0, 0, torch.Generator()), max_new=4, stop=())
            for p in prompts]
    with torch.inference_mode():
        batch = DecodeBatch.prefill(model, rows, tok.pad_token_id, torch.device("cpu"), share_prefix=True)
        assert len(batch.prefixes) == 1 and batch.prefixes[0].users == 2
        batch.decode(model, [5, 6])  # the engine's attention reads it
        model.set_attn_implementation("sdpa")  # transformers' own attention: the prefix is never read
        with pytest.raises(RuntimeError, match="0 of 2 attention layers of LlamaForCausalLM read the shared prefix"):
            batch.decode(model, [5, 6])
    assert engine.share_prefix


def test_sharing_is_off_where_the_engines_attention_is_not_used():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    model.set_attn_implementation("eager")  # not SDPA: the engine leaves the model's attention alone
    engine = HFEngine.from_objects(model, tok, eos_token_ids=())
    assert engine.share_prefix is False
    with pytest.raises(ValueError, match="share_prefix: must be true or false, got 'yes'"):
        HFEngine.from_objects(tiny_model(tok), tok, share_prefix="yes")
