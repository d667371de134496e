"""The hf engine's preallocated KV buffers (issue 21, decode): a decode step writes one column instead of
concatenating the cache, and the engine gives token for token what transformers' concatenation gives."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from mtrl_runtime.engines import HFEngine
from mtrl_runtime.engines.hf._kv_buffer import BufferLayer, PaddedLayer, buffered, padded, reserve_columns, resolve_kv_cache
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.types import GenerationRequest, SamplingParams


def states(columns: int, start: int = 0, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    keys = torch.arange(start, start + columns, dtype=torch.float32).reshape(1, 1, -1, 1).expand(batch, 3, -1, 4)
    return keys.clone(), -keys.clone()


def test_a_step_writes_in_place_and_the_buffer_grows_once_per_headroom():
    plain, layer = DynamicLayer(), BufferLayer(headroom=4)
    for layer_ in (plain, layer):
        layer_.update(*states(10))
    grown = layer._keys_buf
    for step in range(4):  # 10 + 4 = 14 = the room the first update allocated
        out = layer.update(*states(1, 10 + step))
        expected = plain.update(*states(1, 10 + step))
        assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1])
        assert layer._keys_buf is grown, "a step within the room writes into the same buffer"
    assert layer.capacity == 14 and layer.get_seq_length() == 14
    layer.update(*states(1, 14))
    assert layer._keys_buf is not grown and layer.capacity == 19
    assert torch.equal(layer.keys, plain.update(*states(1, 14))[0])


def test_assigning_keys_then_values_reads_the_values_as_they_were():
    """The decode batch crops and re-stacks with ``layer.keys = f(layer.keys); layer.values = f(layer.values)``."""
    layer = BufferLayer(headroom=8)
    layer.update(*states(6))
    layer.update(*states(1, 6))
    keys, values = layer.keys.clone(), layer.values.clone()
    layer.keys = layer.keys[[1], :, 2:, :]
    layer.values = layer.values[[1], :, 2:, :]
    assert torch.equal(layer.keys, keys[[1], :, 2:]) and torch.equal(layer.values, values[[1], :, 2:])
    out = layer.update(*states(1, 7, batch=1))  # adopted with no room: this step grows the buffer
    assert out[0].shape == (1, 3, 6, 4) and torch.equal(out[1][:, :, -1], -torch.full((1, 3, 4), 7.0))


def test_only_plain_caches_are_converted_and_auto_picks_per_dtype_on_cpu():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    out = model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    cache = buffered(out.past_key_values)
    assert all(type(layer) is BufferLayer for layer in cache.layers)
    assert cache.layers[0].get_seq_length() == 3
    assert resolve_kv_cache("auto", model) == "preallocated"
    assert resolve_kv_cache("auto", model.to(torch.bfloat16)) == "padded"
    assert resolve_kv_cache("auto", model.to(torch.float16)) == "concat"  # not measured: transformers' path
    assert resolve_kv_cache("concat", model) == "concat"
    with pytest.raises(ValueError, match="kv_cache: expected auto or one of .* got 'paged'"):
        resolve_kv_cache("paged", model)


async def generate_all(kv_cache: str, dtype: torch.dtype, turns: int = 2) -> list[list[object]]:
    """Greedy multi-turn generations: more requests than batch rows (rows join and leave mid-decode), lengths
    that differ (left padding), and a second turn extending the first (prefix cache hits)."""
    tok = tiny_tokenizer()
    engine = HFEngine.from_objects(tiny_model(tok).to(dtype), tok, eos_token_ids=(), max_batch_size=3,
                                   kv_cache=kv_cache)
    prompts = [tuple(tok.encode("hello world " * (2 + 5 * i))) for i in range(6)]
    out = []
    try:
        for _ in range(turns):
            gens = await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(
                temperature=0.0, max_tokens=40 + 9 * i, seed=i))) for i, p in enumerate(prompts)))
            out.append(gens)
            prompts = [p + g.completion_ids + tuple(tok.encode(" next")) for p, g in zip(prompts, gens)]
        assert engine.stats.decode_s > 0 and engine.stats.joins > 0 and engine.stats.prefix_hit_tokens > 0
        assert engine.kv_cache == kv_cache
    finally:
        await engine.close()
    return out


@pytest.mark.parametrize("kv_cache", ["preallocated", "padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_preallocated_decoding_gives_what_concatenation_gives(dtype, kv_cache):
    old = asyncio.run(generate_all("concat", dtype))
    new = asyncio.run(generate_all(kv_cache, dtype))
    for turn_old, turn_new in zip(old, new, strict=True):
        for a, b in zip(turn_old, turn_new, strict=True):
            assert a.completion_ids == b.completion_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5


def test_a_padded_cache_hands_attention_its_whole_zeroed_buffer_and_refuses_a_pass_it_was_not_reserved_for():
    """``padded``: the attention reads contiguous buffers (bf16 matmuls stay on oneDNN's kernels); the columns past
    the filled part are zero, and the batch's mask, as wide as ``reserve_columns`` says, hides them."""
    tok = tiny_tokenizer()
    out = tiny_model(tok)(input_ids=torch.tensor([[1, 2, 3], [4, 5, 6]]), use_cache=True)
    cache = padded(out.past_key_values, headroom=4)
    layer = cache.layers[0]
    assert all(type(x) is PaddedLayer for x in cache.layers) and layer.capacity == 3
    with pytest.raises(RuntimeError, match="reserve_columns"):
        layer.update(*(t[:, :, :1] for t in (layer.keys, layer.values)))  # no room was reserved for this column
    assert reserve_columns(cache, 1) == 3 + 1 + 4 and all(x.capacity == 8 for x in cache.layers)
    assert reserve_columns(buffered(tiny_model(tok)(input_ids=torch.tensor([[1]]), use_cache=True).past_key_values),
                           1) is None
    before = layer.keys.clone()
    new_keys, new_values = torch.ones(2, *before.shape[1:2], 1, before.shape[3]), torch.ones(2, before.shape[1], 1,
                                                                                             before.shape[3])
    keys, values = layer.update(new_keys, new_values)
    assert keys.shape[-2] == 8 and keys.is_contiguous() and layer.get_seq_length() == 4
    assert torch.equal(keys[:, :, :3], before) and torch.equal(keys[:, :, 3:4], new_keys)
    assert not keys[:, :, 4:].any() and not values[:, :, 4:].any()
    assert layer.get_mask_sizes(1) == (8, 0)
