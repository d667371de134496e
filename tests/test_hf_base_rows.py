"""Base-model rows beside the adapter's (issue 21, evaluation): one hf engine serves requests marked
``base_model`` with its LoRA adapter switched off for those rows only, in the same decode batches as rows that
use it, and each row gets what the base model alone, or the adapter alone, gives."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import HFEngine, ScriptedEngine
from mtrl_runtime.store import open_store
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.types import GenerationRequest, MixesBaseRows, SamplingParams, Task

SYSTEM = "system prompt for the inspection agent: call the tools in order, then answer in JSON. " * 2


def with_adapter(tok: Any, dtype: torch.dtype = torch.float32) -> Any:
    """The tiny model with a random, non-zero LoRA adapter on attention (k/v too: the KV differs) and MLP."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    config = LoraConfig(r=4, lora_alpha=32, init_lora_weights=False,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"])
    return get_peft_model(tiny_model(tok).to(dtype), config).eval()


async def two_turns(engine: HFEngine, tok: Any, prompts: list[tuple[int, ...]], base: list[bool]) -> list[list]:
    """Greedy two-turn generations (turn 2 extends turn 1: prefix cache hits), all rows at once."""
    out = []
    for _ in range(2):
        gens = await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(
            temperature=0.0, max_tokens=12 + 5 * i, seed=i), base_model=b)) for i, (p, b) in enumerate(zip(prompts, base))))
        out.append(gens)
        prompts = [p + g.completion_ids + tuple(tok.encode(" next")) for p, g in zip(prompts, gens)]
    return out


@pytest.mark.parametrize("kv_cache", ["preallocated", "padded"])
@pytest.mark.parametrize("share_prefix", [True, False], ids=["shared-prefix", "own-copies"])
def test_base_rows_in_a_mixed_batch_give_what_the_base_model_alone_gives(share_prefix, kv_cache):
    tok = tiny_tokenizer()
    prompts = [tuple(tok.encode(SYSTEM + f"aircraft {i}" + " check" * i)) for i in range(6)]
    base = [i % 2 == 0 for i in range(6)]  # rows alternate: base, adapter, base, ...

    async def run() -> tuple[list, list, list, Any]:
        mixed = HFEngine.from_objects(with_adapter(tok), tok, eos_token_ids=(), max_batch_size=6,
                                      kv_cache=kv_cache, share_prefix=share_prefix)
        adapter_only = HFEngine.from_objects(with_adapter(tok), tok, eos_token_ids=(), share_prefix=False)
        base_only = HFEngine.from_objects(tiny_model(tok), tok, eos_token_ids=(), share_prefix=False)
        try:
            assert isinstance(mixed, MixesBaseRows) and mixed.mixes_base_rows()
            got = await two_turns(mixed, tok, prompts, base)
            want_adapter = await two_turns(adapter_only, tok, prompts, [False] * 6)
            want_base = await two_turns(base_only, tok, prompts, [False] * 6)
            return got, want_adapter, want_base, mixed.stats
        finally:
            for engine in (mixed, adapter_only, base_only):
                await engine.close()

    got, want_adapter, want_base, stats = asyncio.run(run())
    for turn, (g_turn, a_turn, b_turn) in enumerate(zip(got, want_adapter, want_base, strict=True)):
        for i, (g, a, b) in enumerate(zip(g_turn, a_turn, b_turn, strict=True)):
            want = b if base[i] else a
            assert g.completion_ids == want.completion_ids, (turn, i)
            assert max(abs(x - y) for x, y in zip(g.logprobs, want.logprobs)) <= 1e-4, (turn, i)
            assert g.policy_version == 0
    assert any(a.completion_ids != b.completion_ids for a, b in zip(want_adapter[0], want_base[0])), \
        "the adapter must change the tokens, or the test shows nothing"
    assert stats.mixed_passes > 0 and stats.base_rows_decoded > 0 and stats.prefix_hit_tokens > 0
    assert (stats.shared_prefix_passes > 0) == share_prefix


def test_a_base_model_request_to_an_engine_without_an_adapter_is_refused_once_its_weights_changed():
    """A model holding no LoRA adapter is its own base model while its weights are as loaded (policy version 0:
    ``mtrl eval`` of a roles config not trained yet sends every role's rows as base rows); once its weights
    changed (a full fine-tune's update: version 1) nothing can give the base model's rows, and they are refused."""
    tok = tiny_tokenizer()
    engine = HFEngine.from_objects(tiny_model(tok), tok, eos_token_ids=())
    prompt = tuple(tok.encode("hello"))

    async def served() -> tuple[Any, Any]:
        sampling = SamplingParams(temperature=0.0, max_tokens=4)
        return (await engine.generate(GenerationRequest(prompt, sampling, base_model=True, role="planner")),
                await engine.generate(GenerationRequest(prompt, sampling)))

    assert engine.mixes_base_rows()
    as_base, plain = asyncio.run(served())
    assert as_base.completion_ids == plain.completion_ids and as_base.policy_version == 0
    engine.policy_version = 1
    assert not engine.mixes_base_rows()
    request = GenerationRequest(prompt, SamplingParams(max_tokens=2), base_model=True)
    with pytest.raises(ValueError, match="base_model: this engine's model holds no LoRA adapter it can switch off"):
        asyncio.run(engine.generate(request))


def test_a_base_model_rollout_needs_an_engine_that_mixes_base_rows(tmp_path: Path):
    tok = tiny_tokenizer()
    config = MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path)}})
    coordinator = Coordinator(ScriptedEngine(tok, lambda request, prompt: "done"), open_store(tmp_path / "t.db"),
                              config)
    task = Task(id="t1", prompt="inspect")
    with pytest.raises(ValueError, match="base_model: engine 'scripted' cannot serve the base model beside"):
        coordinator.create_rollout(task, "g1", base_model=True)
    assert coordinator.create_rollout(task, "g1").rollout_id  # the plain rollout still opens
