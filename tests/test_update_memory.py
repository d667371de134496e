"""The update step's memory (issue 22): chunked log-probabilities, checkpointing, a bf16 frozen base, fitting memory.

On a tiny Qwen3 built here (hidden 64, 2 layers): the chunked path and
checkpointing give the gradients of the plain path; a LoRA policy over a
bf16 base loaded from a folder trains, and its logprobs stay close to the
hf engine's; a step that cannot fit fails before any rollout with the
numbers; the vLLM rules fail at config load naming the fields.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
import torch

from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.testing import tiny_tokenizer
from mtrl_runtime.training import (PolicyUpdate, StepDoesNotFit, UpdateSettings, build_policy, policy_from_config,
                                   preflight_folder)
from mtrl_runtime.types import GenerationRequest, SamplingParams, Sample

TEXTS = [
    "You are a helpful assistant. The answer is 42.",
    "What is the value for key A1? Reply with DONE when finished. The answer is 42.",
    "Call the tool, then answer with the result.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def qwen3(tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).to(dtype).eval()


def sample(tokenizer, text: str, advantage: float, prompt_len: int = 4, prefix: str = "") -> Sample:
    ids = tuple(tokenizer(prefix + text)["input_ids"])
    mask = (0,) * prompt_len + (1,) * (len(ids) - prompt_len)
    return Sample(
        rollout_id=text[:8], group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
        behaviour_logprobs_T=tuple(-3.0 if m else 0.0 for m in mask),
        advantages_T=tuple(advantage if m else 0.0 for m in mask),
        policy_version_T=tuple(0 if m else -1 for m in mask),
    )


def gradients(tokenizer, samples, **settings) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The step's metrics and gradients with the LoRA B weights made non-zero (so every LoRA weight gets one)."""
    policy = build_policy(qwen3(tokenizer), tokenizer, rank=4, alpha=8)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    settings.setdefault("precision", "fp32")
    update = PolicyUpdate(policy, UpdateSettings(**settings))
    update.policy.model.train()
    try:
        metrics = update.backward(samples)
    finally:
        update.policy.model.eval()
    grads = {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return metrics, grads


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 1e-5) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=tol, atol=tol), (name, (a[name] - b[name]).abs().max())


def test_chunked_logprobs_give_the_loss_and_gradients_of_full_logits(tokenizer):
    samples = [sample(tokenizer, TEXTS[0], 1.0), sample(tokenizer, TEXTS[1], -0.5), sample(tokenizer, TEXTS[2], 0.7)]
    full_m, full_g = gradients(tokenizer, samples, logprob_chunk_tokens=0)
    chunk_m, chunk_g = gradients(tokenizer, samples, logprob_chunk_tokens=5)  # many chunks, the last one partial
    assert math.isclose(full_m["train/loss"], chunk_m["train/loss"], rel_tol=1e-5, abs_tol=1e-6)
    assert_same(full_g, chunk_g)


def test_chunked_logprobs_with_a_shared_prefix_match_full_logits(tokenizer):
    head = "You are a helpful assistant that answers questions about keys and values. "
    samples = [sample(tokenizer, text, adv, prompt_len=len(tokenizer(head)["input_ids"]) + 2, prefix=head)
               for text, adv in zip(TEXTS, (1.0, -1.0, 0.5))]
    full_m, full_g = gradients(tokenizer, samples, logprob_chunk_tokens=0)
    chunk_m, chunk_g = gradients(tokenizer, samples, logprob_chunk_tokens=7)
    assert chunk_m["train/tokens_shared"] > 0  # the prefix was computed once
    assert math.isclose(full_m["train/loss"], chunk_m["train/loss"], rel_tol=1e-5, abs_tol=1e-6)
    assert_same(full_g, chunk_g)


def test_gradient_checkpointing_gives_the_same_gradients(tokenizer):
    samples = [sample(tokenizer, TEXTS[0], 1.0), sample(tokenizer, TEXTS[1], -0.5)]
    plain_m, plain_g = gradients(tokenizer, samples, gradient_checkpointing="off")
    ckpt_m, ckpt_g = gradients(tokenizer, samples, gradient_checkpointing="on")
    assert plain_m["train/gradient_checkpointing"] == 0.0 and ckpt_m["train/gradient_checkpointing"] == 1.0
    assert math.isclose(plain_m["train/loss"], ckpt_m["train/loss"], rel_tol=1e-6)
    assert_same(plain_g, ckpt_g)


def test_checkpointing_is_off_again_after_the_step(tokenizer):
    from transformers.modeling_layers import GradientCheckpointingLayer

    policy = build_policy(qwen3(tokenizer), tokenizer, rank=4, alpha=8)
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32", gradient_checkpointing="on"))
    metrics = update.step([sample(tokenizer, TEXTS[0], 1.0)])
    assert metrics["train/gradient_checkpointing"] == 1.0
    layers = [m for m in policy.model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert layers and not any(layer.gradient_checkpointing for layer in layers)


def save_bf16_qwen3(tokenizer, folder: Path) -> Path:
    model = qwen3(tokenizer, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text()).get("dtype") == "bfloat16"
    return folder


def test_a_bf16_frozen_base_trains_close_to_the_engine(tokenizer, tmp_path):
    from mtrl_runtime.engines import create_engine

    folder = save_bf16_qwen3(tokenizer, tmp_path / "model")
    config = MtrlConfig.from_dict({"core": {"lora_rank": 4, "lora_alpha": 8, "learning_rate": 1e-2},
                                   "advanced": {"precision": "bf16", "train_device": "cpu"}})
    policy = policy_from_config(config, folder)
    frozen = {p.dtype for p in policy.model.parameters() if not p.requires_grad}
    trained = {p.dtype for p in policy.model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}

    # behaviour logprobs from the hf engine serving the same folder in bf16
    engine = create_engine("hf", str(folder), dtype="bf16", max_batch_size=2)
    prompt = tuple(tokenizer("What is the value for key A1?")["input_ids"])

    async def generate():
        try:
            return await engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=12, seed=0)))
        finally:
            await engine.close()

    generation = asyncio.run(generate())
    ids = prompt + generation.completion_ids
    mask = (0,) * len(prompt) + (1,) * len(generation.completion_ids)
    behaviour = (0.0,) * len(prompt) + generation.logprobs
    engine_sample = Sample(rollout_id="r", group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
                           behaviour_logprobs_T=behaviour, advantages_T=tuple(float(m) for m in mask),
                           policy_version_T=tuple(0 if m else -1 for m in mask))
    update = PolicyUpdate(policy, UpdateSettings.from_config(config))
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    metrics = update.step([engine_sample])
    gap = metrics["train/approx_kl"]  # k3 KL(engine || trainer) over the sampled tokens, before the step
    print(f"bf16 base: trainer/engine logprob gap approx_kl={gap:.2e} ratio_mean={metrics['train/ratio_mean']:.4f}")
    assert math.isfinite(metrics["train/loss"]) and metrics["train/policy_version"] == 1.0
    assert gap < 1e-2 and abs(metrics["train/ratio_mean"] - 1.0) < 0.1
    changed = [n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed and all(p.dtype == torch.float32 for s in update.optimizer.state.values() for p in s.values()
                           if torch.is_tensor(p) and p.dim() > 0)


def test_the_old_fp32_base_stays_selectable(tokenizer, tmp_path):
    folder = save_bf16_qwen3(tokenizer, tmp_path / "model")
    config = MtrlConfig.from_dict({"advanced": {"precision": "bf16", "frozen_base_dtype": "fp32",
                                                "train_device": "cpu"}})
    policy = policy_from_config(config, folder)
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    config = MtrlConfig.from_dict({"advanced": {"precision": "fp32", "train_device": "cpu"}})
    assert {p.dtype for p in policy_from_config(config, folder).model.parameters()} == {torch.float32}


def test_micro_batches_shrink_and_checkpointing_turns_on_when_memory_is_short(tokenizer):
    policy = build_policy(qwen3(tokenizer), tokenizer, rank=4, alpha=8)
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32", micro_batch_tokens=4096))
    assert update.step_plan() == (4096, False)  # this machine's free RAM holds the tiny model's micro-batch
    per_token = update.memory_estimate(False).per_token
    update.free_memory = lambda device: per_token * 100  # room for ~70 tokens without checkpointing
    budget, recompute = update.step_plan()
    assert recompute and budget < 4096
    samples = [sample(tokenizer, text, 1.0) for text in TEXTS]
    metrics = update.step(samples)
    assert metrics["train/micro_batches"] > 1 and metrics["train/micro_batch_budget"] == float(budget)
    assert math.isfinite(metrics["train/loss"])


def test_a_step_that_cannot_fit_is_reported_with_the_numbers(tokenizer):
    policy = build_policy(qwen3(tokenizer), tokenizer, rank=4, alpha=8)
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32"))
    update.check_fits()  # plenty of room here
    update.free_memory = lambda device: 64 * 1024
    with pytest.raises(StepDoesNotFit) as info:
        update.check_fits()
    message = str(info.value)
    assert "model parameters" in message and "trainable parameters" in message and "micro-batch of 256 tokens" in message
    assert "free 0.00 GB" in message and "advanced.micro_batch_tokens" in message


def test_a_model_too_big_for_this_machine_fails_before_loading(tmp_path):
    from transformers import Qwen3Config

    folder = tmp_path / "huge"
    # ~2.5e12 parameters: the config alone is enough, nothing is loaded
    Qwen3Config(vocab_size=151936, hidden_size=32768, intermediate_size=131072, num_hidden_layers=200,
                num_attention_heads=64, num_key_value_heads=8, head_dim=512).save_pretrained(folder)
    with pytest.raises(StepDoesNotFit, match=r"model parameters [\d,]+ x bfloat16|model parameters [\d,]+ x float32"):
        preflight_folder(MtrlConfig.from_dict({"advanced": {"train_device": "cpu"}}), folder)


def test_full_finetune_with_vllm_is_refused_at_load_with_the_reason():
    with pytest.raises(ConfigError) as info:
        MtrlConfig.from_dict({"core": {"engine": "vllm"}, "advanced": {"full_finetune": True}})
    message = str(info.value)
    assert "advanced.full_finetune" in message and "'vllm'" in message and "load_lora_adapter" in message
    MtrlConfig.from_dict({"core": {"engine": "hf"}, "advanced": {"full_finetune": True}})  # fine elsewhere


def test_vllm_keep_versions_follows_the_staleness_bound():
    def config(**advanced):
        return MtrlConfig.from_dict({"core": {"engine": "vllm"}, "advanced": advanced})

    assert config().advanced.engine_options["keep_versions"] == 2
    stale = {"async_config": {"enabled": True, "max_steps_off_policy": 4}}
    assert config(**stale).advanced.engine_options["keep_versions"] == 5
    assert config(**stale, engine_options={"keep_versions": 7}).advanced.engine_options["keep_versions"] == 7
    with pytest.raises(ConfigError) as info:
        config(**stale, engine_options={"keep_versions": 3})
    message = str(info.value)
    assert "advanced.engine_options.keep_versions: 3" in message and "max_steps_off_policy 4" in message
    assert "5" in message


@pytest.mark.parametrize(("key", "value"), [("logprob_chunk_tokens", -1), ("gradient_checkpointing", "sometimes"),
                                            ("frozen_base_dtype", "fp8")])
def test_memory_settings_out_of_range_name_the_field_and_value(key, value):
    with pytest.raises(ConfigError) as info:
        MtrlConfig.from_dict({"advanced": {key: value}})
    assert f"advanced.{key}" in str(info.value) and repr(value) in str(info.value)


def test_full_finetune_with_an_engine_that_takes_adapters_fails_before_the_first_rollout(tmp_path, tiny_model_dir,
                                                                                         tiny_tok):
    from mtrl_adapters import rollout
    from mtrl_runtime import MultiTurnRLTrainer
    from mtrl_runtime.engines import ScriptedEngine

    engine = ScriptedEngine(tiny_tok, lambda request, text: "The answer is 42.")  # weights would be pushed
    started = []

    @rollout
    async def agent(task) -> None:
        started.append(task.id)

    cfg = MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run"), "model": str(tiny_model_dir),
                                         "group_size": 2, "train_batch_size": 1, "max_steps": 1},
                                "advanced": {"full_finetune": True, "checkpoint_every": 0}})
    trainer = MultiTurnRLTrainer(agent_env=agent, training_dataset=[{"id": "a", "prompt": "q"}], config=cfg,
                                 engine=engine, tracking=False)
    with pytest.raises(ConfigError, match=r"advanced.full_finetune: true .* ScriptedEngine .* LoRA adapter"):
        trainer.train(progress=False)
    assert started == []


def test_pushed_versions_kept_on_disk_follow_the_vllm_staleness_bound(tmp_path, tiny_model_dir, tiny_tok):
    """The vLLM engine reloads its kept adapters from their folders after a restart: as many stay on disk."""
    from mtrl_adapters import aupdate_reward, rollout
    from mtrl_runtime import MultiTurnRLTrainer
    from mtrl_runtime.engines import ScriptedEngine

    import openai

    engine = ScriptedEngine(tiny_tok, lambda request, text: "The answer is 42.")  # stands in for the vLLM server
    client = openai.AsyncOpenAI(base_url="http://unused.invalid/v1", api_key="unused", max_retries=0)
    import random

    rewards = random.Random(0)  # rewards differ within every group, so every step updates and pushes a version

    @rollout
    async def agent(task) -> None:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
        await aupdate_reward(rewards.random())

    cfg = MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "model": str(tiny_model_dir), "engine": "vllm", "group_size": 2,
                 "train_batch_size": 1, "max_steps": 4, "lora_rank": 4, "lora_alpha": 8,
                 "sampling_params": {"max_tokens": 8}},
        "advanced": {"checkpoint_every": 0, "async_config": {"enabled": True, "max_steps_off_policy": 2}},
    })
    assert cfg.advanced.engine_options["keep_versions"] == 3
    MultiTurnRLTrainer(agent_env=agent, training_dataset=[{"id": "a", "prompt": "q"}], config=cfg, engine=engine,
                       tracking=False).train(progress=False)
    folder = tmp_path / "run" / "adapters"
    pushed = [version for _, version in engine.adapters]
    assert len(pushed) == 4
    assert sorted(p.name for p in folder.iterdir()) == [f"v{v}" for v in sorted(pushed)[-3:]]
