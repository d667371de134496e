"""The PolicyEngine contract: the hf engine (a tiny model) and the scripted double pass the same tests.

The vllm engine needs a vLLM install; its own tests (test_vllm_engine.py, opt-in) cover it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from mtrl_runtime.engines import ENGINES, EngineClosedError, create_engine
from mtrl_runtime.training import shares_model
from mtrl_runtime.types import (
    Generation, GenerationRequest, PolicyEngine, SamplingParams, SharedModelEngine, StreamingEngine, TokenDelta,
)

LONG_REPLY = "the answer is forty two, " * 4


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA adapter of the tiny model, with non-zero B so it changes outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    folder = tmp_path_factory.mktemp("adapter")
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config).save_pretrained(folder)
    return folder


@pytest.fixture(params=["hf", "scripted"])
async def engine(request: pytest.FixtureRequest, tiny_model_dir: Path, tiny_tok: Any) -> AsyncIterator[Any]:
    if request.param == "hf":
        eng = create_engine("hf", str(tiny_model_dir), max_batch_size=4)
    else:
        eng = create_engine("scripted", tokenizer=tiny_tok, script=lambda req, prompt: LONG_REPLY)
    yield eng
    await eng.close()


def ask(engine: Any, max_tokens: int, seed: int = 0) -> GenerationRequest:
    ids = tuple(engine.tokenizer.encode("What is the value for key A1?"))
    return GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=max_tokens, seed=seed))


async def test_an_engine_is_a_policy_engine(engine: Any) -> None:
    assert isinstance(engine, PolicyEngine)
    assert engine.name in ENGINES and engine.policy_version == 0


async def test_generate_returns_one_logprob_per_token_within_max_tokens(engine: Any) -> None:
    for max_tokens in (1, 3, 64):
        gen = await engine.generate(ask(engine, max_tokens))
        assert isinstance(gen, Generation)
        assert 1 <= len(gen.completion_ids) <= max_tokens
        assert len(gen.logprobs) == len(gen.completion_ids)
        assert all(lp <= 0.0 for lp in gen.logprobs)
        assert gen.finish_reason in {"stop", "length"}
        if gen.finish_reason == "length":
            assert len(gen.completion_ids) == max_tokens
    assert (await engine.generate(ask(engine, 1))).finish_reason in {"stop", "length"}


async def test_a_streaming_engine_streams_the_tokens_generate_returns(engine: Any) -> None:
    assert isinstance(engine, StreamingEngine)  # both engines here stream; vllm answers whole (docs/protocols.md)
    items = [item async for item in engine.generate_stream(ask(engine, 24, seed=3))]
    *deltas, final = items
    assert isinstance(final, Generation) and all(isinstance(d, TokenDelta) for d in deltas) and deltas
    assert tuple(t for d in deltas for t in d.token_ids) == final.completion_ids
    assert tuple(lp for d in deltas for lp in d.logprobs) == final.logprobs
    whole = await engine.generate(ask(engine, 24, seed=3))  # seeded: the same tokens streamed or not
    assert whole.completion_ids == final.completion_ids and whole.finish_reason == final.finish_reason
    assert whole.logprobs == pytest.approx(final.logprobs, abs=1e-5)


async def test_closing_a_stream_early_stops_the_generation(engine: Any) -> None:
    stream = engine.generate_stream(ask(engine, 64, seed=1))
    first = await stream.__anext__()
    assert isinstance(first, TokenDelta)
    await stream.aclose()  # the caller went away
    assert (await engine.generate(ask(engine, 2))).completion_ids  # the engine serves on
    if engine.name == "hf":  # the streamed row was dropped, never finished: only the later call generated
        assert engine.stats.generations == 1 and engine.stats.tokens <= 2


async def test_generate_reports_the_policy_version_served(engine: Any) -> None:
    assert (await engine.generate(ask(engine, 2))).policy_version == engine.policy_version == 0


async def test_load_adapter_sets_the_version(engine: Any, adapter_dir: Path) -> None:
    await engine.load_adapter(str(adapter_dir), 3)
    assert engine.policy_version == 3
    assert (await engine.generate(ask(engine, 2))).policy_version == 3


async def test_generate_after_close_fails(engine: Any) -> None:
    await engine.close()
    with pytest.raises(EngineClosedError):
        await engine.generate(ask(engine, 2))
    await engine.close()  # idempotent


async def test_only_the_hf_engine_shares_its_model_with_a_trainer(engine: Any) -> None:
    shared = engine.name == "hf"
    assert isinstance(engine, SharedModelEngine) is shared
    assert shares_model(engine) is shared
    if shared:
        assert engine.lora_fold is not None and engine.model is not None


def test_importing_the_engines_and_listing_them_imports_no_engine() -> None:
    code = (
        "import sys\n"
        "import mtrl_runtime.engines as e\n"
        "from mtrl_runtime.engines import ENGINES, EngineClosedError, create_engine, resolve_model\n"
        "assert e.ENGINES.names() == ['hf', 'scripted', 'vllm'], e.ENGINES.names()\n"
        "heavy = [m for m in ('torch', 'transformers', 'httpx', 'mtrl_runtime.engines.hf') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
