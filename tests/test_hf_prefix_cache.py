"""Prefix caching: the radix-tree KV store on its own, and the hf engine with the cache on giving what it
gives with the cache off (and what a direct forward pass gives), while prefilling far fewer tokens."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from mtrl_runtime.engines import HFEngine, create_engine
from mtrl_runtime.engines.hf._prefix_cache import PrefixCache, common_length
from mtrl_runtime.engines.hf._prefix_prefill import shared_groups
from mtrl_runtime.evaluation import base_policy
from mtrl_runtime.testing import tiny_model
from mtrl_runtime.types import Generation, GenerationRequest, SamplingParams

SYSTEM = "You are a helpful assistant. Use the tools when they help. Call the tool, then answer with the result. " * 3
QUESTIONS = [
    "What is the value for key A1?",
    "abc",
    "The answer is 42.",
    "Reply with DONE when finished.",
    "0123456789",
    "system user assistant",
    "function name arguments",
    "<tool_call> lookup",
]
TOOL_REPLY = "<tool_response>\n{\"value\": 42}\n</tool_response>"


# ---------------------------------------------------------------------- the store on its own
def fake_kv(ids: tuple[int, ...], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """KV whose value at position p depends only on (p, ids[p]): the property real prefix KV has."""
    pos = torch.arange(len(ids), dtype=torch.float32)
    tok = torch.tensor(ids, dtype=torch.float32)
    out = []
    for layer in range(layers):
        keys = (pos * 1000 + tok + layer * 0.5).reshape(1, 1, -1, 1).expand(1, 2, -1, 3).clone()
        out.append((keys, -keys))
    return out


def assert_states_are(states: list[tuple[torch.Tensor, torch.Tensor]], ids: tuple[int, ...]) -> None:
    for (k, v), (ek, ev) in zip(states, fake_kv(ids), strict=True):
        assert torch.equal(k, ek) and torch.equal(v, ev)


def test_lookup_reuses_the_longest_shared_stretch_and_leaves_one_token_to_feed():
    cache = PrefixCache(10_000)
    stored = tuple(range(100))
    assert cache.store(stored, fake_kv(stored))
    entry, n = cache.lookup(stored + (7, 8))
    assert n == 100
    assert_states_are(entry.states(n), stored)
    assert cache.lookup(stored)[1] == 99, "a stored copy of the whole prompt leaves its last token to feed"
    diverging = stored[:60] + (999, 998)
    entry, n = cache.lookup(diverging)
    assert n == 60, "the first tokens of a longer entry are reused"
    assert_states_are(entry.states(n), diverging[:60])
    assert cache.lookup((999, 1, 2)) is None
    assert cache.lookup((0,)) is None, "a one-token prompt always prefills its token"
    assert cache.match_length(stored + (1,)) == 100 and cache.match_length((5,)) == 0


def test_a_shared_stretch_is_held_once_and_becomes_its_own_entry():
    cache = PrefixCache(10_000)
    system = tuple(range(500, 800))
    first, second = system + (1, 2, 3, 4), system + (1, 2, 9, 9, 9)
    cache.store(first, fake_kv(first))
    assert cache.store(second, fake_kv(second))
    assert system + (1, 2) in cache, "storing ids that diverge inside an entry splits it there"
    assert cache.tokens == len(system) + 2 + 2 + 3 and len(cache) == 3
    for ids in (first, second):
        entry, n = cache.lookup(ids + (0,))
        assert n == len(ids)
        assert_states_are(entry.states(n), ids)
    assert not cache.store(system, fake_kv(system)), "a stretch already held adds no tokens"
    assert system in cache and cache.tokens == len(system) + 7


def test_eviction_is_lru_and_stays_within_the_budget():
    cache = PrefixCache(100)
    a, b, c = (tuple(range(s, s + 40)) for s in (1000, 2000, 3000))
    cache.store(a, fake_kv(a))
    cache.store(b, fake_kv(b))
    cache.lookup(a + (1,))  # a is now more recent than b
    cache.store(c, fake_kv(c))
    assert a in cache and c in cache and b not in cache
    assert cache.tokens == 80 <= cache.max_tokens and cache.evictions == 1
    too_long = tuple(range(101))
    assert not cache.store(too_long, fake_kv(too_long)) and too_long not in cache


def test_random_stores_keep_the_tree_whole_within_budget_and_exact():
    """Stores and lookups of branching conversations: the budget holds, parents outlive their children,
    the token count is the sum of segments, and every lookup returns the KV of exactly its tokens."""
    rng = random.Random(0)
    cache = PrefixCache(600)
    conversations = [tuple(rng.randrange(50) for _ in range(rng.randrange(20, 120))) for _ in range(6)]
    for _ in range(300):
        base = rng.choice(conversations)
        ids = base[: rng.randrange(1, len(base) + 1)] + tuple(rng.randrange(50) for _ in range(rng.randrange(0, 40)))
        if rng.random() < 0.6:
            cache.store(ids, fake_kv(ids))
            if rng.random() < 0.3:
                conversations.append(ids)
        hit = cache.lookup(ids)
        if hit is not None:
            entry, n = hit
            assert entry.ids[:n] == ids[:n] and n < len(ids)
            assert_states_are(entry.states(n), ids[:n])
        entries = list(cache._entries.values())
        assert cache.tokens <= cache.max_tokens
        assert cache.tokens == sum(e.length - e.start for e in entries)
        assert all(e.parent is None or e.parent.ids in cache for e in entries)
        assert all(e.segment[0][0].shape[2] == e.length - e.start for e in entries)
    assert cache.evictions > 0


def test_clear_drops_everything_and_refuses_stores_from_before():
    cache = PrefixCache(1000)
    ids = tuple(range(10))
    cache.store(ids, fake_kv(ids))
    epoch = cache.epoch
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0 and cache.epoch == epoch + 1
    assert not cache.store(ids, fake_kv(ids), epoch=epoch), "KV computed before the clear is stale"
    assert cache.store(ids, fake_kv(ids), epoch=cache.epoch)


def test_lookup_is_fast_for_long_prompts_and_many_entries():
    rng = random.Random(1)
    cache = PrefixCache(1_000_000)
    system = tuple(rng.randrange(1000) for _ in range(1500))
    for _ in range(64):
        ids = system + tuple(rng.randrange(1000) for _ in range(rng.randrange(500, 2500)))
        cache.store(ids, [(torch.zeros(1, 1, len(ids), 1), torch.zeros(1, 1, len(ids), 1))])
    prompts = [system + tuple(rng.randrange(1000) for _ in range(1500)) for _ in range(200)]
    started = time.perf_counter()
    for prompt in prompts:
        assert cache.lookup(prompt)[1] >= len(system)
    per_lookup_ms = (time.perf_counter() - started) / len(prompts) * 1000
    assert per_lookup_ms < 5.0, f"{per_lookup_ms:.2f} ms per lookup of a 3,000-token prompt"


def test_shared_groups_find_common_stretches_worth_computing_once():
    system = tuple(range(100, 160))
    prompts = [system + (1, 2), (7,) * 70, system + (3,), system + (1, 5, 6), (7,) * 70 + (8,)]
    groups = shared_groups(prompts, 32)
    assert sorted(groups) == sorted([([0, 2, 3], 60), ([1, 4], 69)])  # each member keeps >= 1 token to feed
    assert shared_groups([system + (1,), (9,) * 40], 32) == []
    assert common_length(system + (1, 2), system + (1, 3)) == 61


# ---------------------------------------------------------------------- the engine, cache on vs off
@pytest.fixture
def model(tiny_tok: Any) -> Any:
    return tiny_model(tiny_tok)


def ids_of(tok: Any, text: str) -> tuple[int, ...]:
    return tuple(tok.encode(text))


def make_request(prompt_ids: tuple[int, ...], greedy: bool, seed: int, max_tokens: int = 10) -> GenerationRequest:
    sampling = SamplingParams(temperature=0.0 if greedy else 1.0, max_tokens=max_tokens, seed=seed)
    return GenerationRequest(prompt_ids, sampling)


def engines(model: Any, tok: Any, **options: Any) -> tuple[HFEngine, HFEngine]:
    """(cache off, cache on) over the same model; eos disabled so completions have max_tokens tokens."""
    return (HFEngine.from_objects(model, tok, eos_token_ids=(), prefix_cache_tokens=0, **options),
            HFEngine.from_objects(model, tok, eos_token_ids=(), **options))


def assert_same(off: list[Generation], on: list[Generation]) -> None:
    for a, b in zip(off, on, strict=True):
        assert a.completion_ids == b.completion_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def direct_logprobs_T(model: Any, prompt_ids: tuple[int, ...], completion_ids: tuple[int, ...]) -> torch.Tensor:
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logprobs_TV = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    start = len(prompt_ids) - 1
    return logprobs_TV[start : start + len(completion_ids)].gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


def assert_matches_forward(model: Any, req: GenerationRequest, gen: Generation) -> None:
    expected_T = direct_logprobs_T(model, req.prompt_ids, gen.completion_ids)
    assert torch.allclose(torch.tensor(gen.logprobs), expected_T, atol=1e-4), (gen.logprobs, expected_T)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded"])
async def test_a_repeated_request_reuses_its_prompt_and_gives_the_same_tokens(model: Any, tiny_tok: Any, greedy: bool):
    off, on = engines(model, tiny_tok)
    req = make_request(ids_of(tiny_tok, SYSTEM + QUESTIONS[0]), greedy, seed=3)
    try:
        expected = await off.generate(req)
        gens = [await on.generate(req) for _ in range(3)]
        assert_same([expected] * 3, gens)
        n = len(req.prompt_ids)
        assert on.stats.prefill_tokens == n + 2 and on.stats.prefix_hit_tokens == 2 * (n - 1)
        assert off.stats.prefill_tokens == n and off.stats.prefix_hit_tokens == 0
    finally:
        await off.close()
        await on.close()


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded"])
async def test_a_second_turn_prefills_only_its_new_tokens(model: Any, tiny_tok: Any, greedy: bool):
    off, on = engines(model, tiny_tok)
    first = make_request(ids_of(tiny_tok, SYSTEM + QUESTIONS[1]), greedy, seed=5)
    tool = ids_of(tiny_tok, TOOL_REPLY)
    try:
        turns = {}
        for name, eng in (("off", off), ("on", on)):
            gen1 = await eng.generate(first)
            second = make_request(first.prompt_ids + gen1.completion_ids + tool, greedy, seed=6)
            before = eng.stats.prefill_tokens
            gen2 = await eng.generate(second)
            turns[name] = ([gen1, gen2], eng.stats.prefill_tokens - before, second)
        assert_same(turns["off"][0], turns["on"][0])
        assert turns["on"][1] == len(tool) + 1, "the completion's last token and the tool message"
        assert turns["off"][1] == len(turns["off"][2].prompt_ids)
        assert_matches_forward(model, turns["on"][2], turns["on"][0][1])
    finally:
        await off.close()
        await on.close()


async def admit_together(eng: HFEngine, reqs: list[GenerationRequest]) -> list[Generation]:
    """Queue ``reqs`` while the worker waits for the weights lock, so one admission takes them all."""
    eng.weights_lock.acquire()
    try:
        tasks = [asyncio.ensure_future(eng.generate(r)) for r in reqs]
        await asyncio.sleep(0.05)
    finally:
        eng.weights_lock.release()
    return list(await asyncio.gather(*tasks))


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded"])
async def test_concurrent_requests_compute_their_shared_prefix_once(model: Any, tiny_tok: Any, greedy: bool):
    off, on = engines(model, tiny_tok)
    system = ids_of(tiny_tok, SYSTEM)
    questions = [ids_of(tiny_tok, q) for q in QUESTIONS]
    assert len({q[0] for q in questions}) == len(questions), "distinct first tokens: the shared stretch is the system"
    reqs = [make_request(system + q, greedy, seed=i) for i, q in enumerate(questions)]
    try:
        expected = await asyncio.gather(*(off.generate(r) for r in reqs))
        passes = on.stats.prefill_passes
        gens = await admit_together(on, reqs)
        assert on.stats.prefill_passes == passes + 1, "one admission"
        assert_same(expected, gens)
        for req, gen in zip(reqs, gens):
            assert_matches_forward(model, req, gen)
        assert on.stats.prefill_tokens == len(system) + sum(len(q) for q in questions)
        assert on.stats.prefix_hit_tokens == len(reqs) * len(system)
        assert off.stats.prefill_tokens == sum(len(r.prompt_ids) for r in reqs)
        assert system in on.prefix_cache
    finally:
        await off.close()
        await on.close()


async def test_rows_joining_a_running_batch_reuse_prefixes_and_match(model: Any, tiny_tok: Any):
    """A long row decodes; rows extending its prompt and rows sharing only the system join it mid-decode."""
    off, on = engines(model, tiny_tok)
    long_req = make_request(ids_of(tiny_tok, SYSTEM + QUESTIONS[2]), greedy=False, seed=1, max_tokens=50)
    late = [make_request(long_req.prompt_ids + ids_of(tiny_tok, " " + q), greedy=g, seed=i, max_tokens=8)
            for i, (q, g) in enumerate(zip(QUESTIONS[3:6], (True, False, False)))]
    late.append(make_request(ids_of(tiny_tok, SYSTEM + QUESTIONS[7]), greedy=False, seed=9, max_tokens=8))
    try:
        results = {}
        for name, eng in (("off", off), ("on", on)):
            running = asyncio.ensure_future(eng.generate(long_req))
            while eng.stats.decode_passes < 3:
                await asyncio.sleep(0.001)
            late_gens = await asyncio.gather(*(eng.generate(r) for r in late))
            results[name] = [await running, *late_gens]
            assert eng.stats.joins >= 1
        assert_same(results["off"], results["on"])
        for req, gen in zip([long_req, *late], results["on"]):
            assert_matches_forward(model, req, gen)
        assert on.stats.prefix_hit_tokens >= 3 * len(long_req.prompt_ids)
    finally:
        await off.close()
        await on.close()


async def test_a_small_budget_evicts_and_outputs_stay_exact(model: Any, tiny_tok: Any):
    off, _ = engines(model, tiny_tok)
    on = HFEngine.from_objects(model, tiny_tok, eos_token_ids=(), prefix_cache_tokens=60)
    reqs = [make_request(ids_of(tiny_tok, q * 2), greedy=False, seed=i) for i, q in enumerate(QUESTIONS)]
    try:
        expected = [await off.generate(r) for r in reqs]
        gens = []
        for r in reqs + reqs[:2]:
            gens.append(await on.generate(r))
            assert on.prefix_cache.tokens <= 60
        assert_same(expected + expected[:2], gens)
        assert on.prefix_cache.evictions > 0
    finally:
        await off.close()
        await on.close()


async def test_zero_disables_the_cache(model: Any, tiny_tok: Any, tiny_model_dir: Path):
    off, _ = engines(model, tiny_tok)
    req = make_request(ids_of(tiny_tok, SYSTEM), greedy=True, seed=0)
    try:
        assert off.prefix_cache is None
        for _ in range(2):
            await off.generate(req)
        assert off.stats.prefix_hit_tokens == 0 and off.stats.prefill_tokens == 2 * len(req.prompt_ids)
    finally:
        await off.close()
    configured = create_engine("hf", str(tiny_model_dir), prefix_cache_tokens=0)  # as advanced.engine_options
    assert configured.prefix_cache is None
    await configured.close()
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        HFEngine.from_objects(model, tiny_tok, prefix_cache_tokens=-1)


# ---------------------------------------------------------------------- invalidation when the weights change
async def test_set_policy_version_clears_and_the_next_request_uses_the_new_weights(tiny_tok: Any):
    model = tiny_model(tiny_tok)
    eng = HFEngine.from_objects(model, tiny_tok, eos_token_ids=())
    req = make_request(ids_of(tiny_tok, SYSTEM + QUESTIONS[0]), greedy=False, seed=2)
    try:
        await eng.generate(req)
        assert len(eng.prefix_cache) > 0
        with eng.weights_lock, torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
            eng.set_policy_version(1)
        assert len(eng.prefix_cache) == 0
        after = await eng.generate(req)
        changed = tiny_model(tiny_tok)
        with torch.no_grad():
            changed.model.layers[0].mlp.down_proj.weight.mul_(3.0)
        fresh = HFEngine.from_objects(changed, tiny_tok, eos_token_ids=(), prefix_cache_tokens=0)
        assert_same([await fresh.generate(req)], [after])
        await fresh.close()
    finally:
        await eng.close()


async def test_a_row_in_flight_across_a_weight_change_stores_nothing(tiny_tok: Any):
    model = tiny_model(tiny_tok)
    eng = HFEngine.from_objects(model, tiny_tok, eos_token_ids=())
    req = make_request(ids_of(tiny_tok, SYSTEM + QUESTIONS[4]), greedy=False, seed=4, max_tokens=40)
    try:
        running = asyncio.ensure_future(eng.generate(req))
        while eng.stats.decode_passes < 3:
            await asyncio.sleep(0.001)
        with eng.weights_lock, torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.mul_(2.0)
            eng.set_policy_version(1)
        gen = await running
        follow = make_request(req.prompt_ids + gen.completion_ids + ids_of(tiny_tok, TOOL_REPLY), False, seed=5)
        before = eng.stats.prefill_tokens
        assert_matches_forward(model, follow, await eng.generate(follow))
        assert eng.stats.prefill_tokens - before == len(follow.prompt_ids), "the row's KV mixed both weights"
    finally:
        await eng.close()


def save_lora_adapter(tok: Any, folder: Path) -> Path:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(tiny_model(tok), config).save_pretrained(folder)
    return folder


async def test_load_adapter_and_base_policy_clear_the_cache(tiny_tok: Any, tmp_path: Path):
    from peft import PeftModel

    base = tiny_model(tiny_tok)
    eng = HFEngine.from_objects(base, tiny_tok, eos_token_ids=())
    req = make_request(ids_of(tiny_tok, SYSTEM + QUESTIONS[3]), greedy=False, seed=8)
    adapter = save_lora_adapter(tiny_tok, tmp_path / "v1")
    tuned = PeftModel.from_pretrained(tiny_model(tiny_tok), str(adapter)).eval()
    try:
        before = await eng.generate(req)
        assert_matches_forward(tiny_model(tiny_tok), req, before)
        await eng.load_adapter(str(adapter), 1)
        assert len(eng.prefix_cache) == 0
        with_adapter = await eng.generate(req)
        assert_matches_forward(tuned, req, with_adapter)
        assert len(eng.prefix_cache) > 0
        async with base_policy(eng):
            assert len(eng.prefix_cache) == 0, "the adapter's KV must not serve the base model"
            as_base = await eng.generate(req)
            assert_matches_forward(tiny_model(tiny_tok), req, as_base)
            assert as_base.completion_ids == before.completion_ids
        assert len(eng.prefix_cache) == 0, "nor the base model's KV the adapter"
        again = await eng.generate(req)
        assert again.completion_ids == with_adapter.completion_ids and again.policy_version == 1
        assert_matches_forward(tuned, req, again)
    finally:
        await eng.close()
