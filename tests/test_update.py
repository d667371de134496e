"""The policy update on a real tiny Llama: learning, micro-batching, the lock, checkpoints."""

import contextlib
import threading
import time

import pytest
import torch

from mtrl_runtime.algorithms import LossParams
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.training import PolicyUpdate, UpdateSettings, build_policy, plan_micro_batches
from mtrl_runtime.types import Sample

TEXTS = [
    "You are a helpful assistant. The answer is 42.",
    "What is the value for key A1? Reply with DONE when finished. The answer is 42.",
    "Call the tool, then answer with the result.",
    "system user assistant tool 0123456789",
]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def make_policy(tokenizer, **kwargs):
    kwargs.setdefault("rank", 8)
    kwargs.setdefault("alpha", 16)
    return build_policy(tiny_model(tokenizer, seed=0), tokenizer, **kwargs)


def token_logprobs(model, ids):
    """log p(token i | tokens < i) for i >= 1, from one plain forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def sample_for(model, tokenizer, text, prompt_len=4, advantage=1.0):
    """A sample whose behaviour logprobs are the model's own (on-policy)."""
    ids = tuple(tokenizer(text)["input_ids"])
    n = len(ids)
    logp = [0.0] + token_logprobs(model, list(ids)).tolist()
    mask = (0,) * prompt_len + (1,) * (n - prompt_len)
    return Sample(
        rollout_id=text[:8], group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
        behaviour_logprobs_T=tuple(lp if m else 0.0 for lp, m in zip(logp, mask)),
        advantages_T=tuple(advantage if m else 0.0 for m in mask),
        policy_version_T=tuple(0 if m else -1 for m in mask),
    )


def sequence_logprob(model, sample):
    logp = token_logprobs(model, list(sample.token_ids_T))
    return float((logp * torch.tensor(sample.loss_mask_T[1:], dtype=torch.float32)).sum())


def step_gradients(tokenizer, samples, settings, policy=None) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The LoRA gradients and metrics of one ``backward`` over ``samples`` on ``policy`` (default a fresh one) with
    its lora_B made nonzero (seeded): the B matrices start at zero, which zeroes A's gradient."""
    policy = policy or make_policy(tokenizer)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
    metrics = PolicyUpdate(policy, settings).backward(samples)
    return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}, metrics


def test_plan_micro_batches_fits_the_budget():
    # longest first: 10+8 fill 2 x 10 = 20; 5+3 fill 2 x 5 = 10
    assert plan_micro_batches([5, 10, 3, 8], budget=20) == [[1, 3], [0, 2]]
    assert plan_micro_batches([30, 4], budget=20) == [[0], [1]]  # too long: alone


@pytest.mark.parametrize("loss_fn", ["ppo", "cispo", "importance_sampling"])
def test_repeated_steps_raise_the_logprob_of_a_positive_sample(tokenizer, loss_fn):
    policy = make_policy(tokenizer)
    sample = sample_for(policy.model, tokenizer, TEXTS[0])
    update = PolicyUpdate(policy, UpdateSettings(loss_fn=loss_fn, learning_rate=1e-2, precision="fp32"))
    before = sequence_logprob(policy.model, sample)
    for _ in range(5):
        metrics = update.step([sample])
    after = sequence_logprob(policy.model, sample)
    assert after > before + 0.5, (before, after)
    assert metrics["train/policy_version"] == 5.0 and metrics["train/tokens_trained"] == sum(sample.loss_mask_T)
    assert not policy.model.training  # back in eval() after the update


def test_negative_advantage_lowers_the_logprob(tokenizer):
    policy = make_policy(tokenizer)
    sample = sample_for(policy.model, tokenizer, TEXTS[1], advantage=-1.0)
    update = PolicyUpdate(policy, UpdateSettings(learning_rate=1e-2, precision="fp32"))
    before = sequence_logprob(policy.model, sample)
    for _ in range(3):
        update.step([sample])
    assert sequence_logprob(policy.model, sample) < before - 0.5


def grads_after_backward(tokenizer, samples, budget, aggregation):
    settings = UpdateSettings(
        micro_batch_tokens=budget, precision="fp32", loss=LossParams(aggregation=aggregation)
    )
    return step_gradients(tokenizer, samples, settings)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_micro_batching_gives_the_gradient_of_one_batch(tokenizer, aggregation):
    base = make_policy(tokenizer)
    samples = [
        sample_for(base.model, tokenizer, text, advantage=adv)
        for text, adv in zip(TEXTS, [1.0, -0.5, 2.0, -1.5])
    ]
    one, m_one = grads_after_backward(tokenizer, samples, budget=10_000, aggregation=aggregation)
    many, m_many = grads_after_backward(tokenizer, samples, budget=24, aggregation=aggregation)
    assert m_one["train/micro_batches"] == 1 and m_many["train/micro_batches"] >= 3
    assert m_one["train/loss"] == pytest.approx(m_many["train/loss"], abs=1e-6)
    for name in one:
        assert torch.allclose(one[name], many[name], atol=1e-6, rtol=1e-4), name
    assert any(g.abs().sum() > 0 for g in one.values())


def test_step_waits_for_the_weights_lock(tokenizer):
    policy = make_policy(tokenizer)
    sample = sample_for(policy.model, tokenizer, TEXTS[2])
    lock = threading.Lock()
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32"), weights_lock=lock)
    done = threading.Event()
    with lock:  # an engine generating with the shared model
        worker = threading.Thread(target=lambda: (update.step([sample]), done.set()))
        worker.start()
        time.sleep(0.3)
        assert not done.is_set()
    worker.join(timeout=30)
    assert done.is_set() and update.version == 1


def test_checkpoint_round_trip_restores_adapter_optimizer_and_version(tokenizer, tmp_path):
    policy = make_policy(tokenizer)
    sample = sample_for(policy.model, tokenizer, TEXTS[1])
    settings = UpdateSettings(learning_rate=1e-2, precision="fp32")
    update = PolicyUpdate(policy, settings)
    update.step([sample])
    update.step([sample])
    folder = update.save_checkpoint(tmp_path / "step-2")
    update.save_checkpoint(tmp_path / "step-2")  # overwriting an existing checkpoint works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]  # no temp folders left

    restored = PolicyUpdate(make_policy(tokenizer), settings)
    restored.load_checkpoint(folder)
    assert restored.version == 2
    assert sequence_logprob(restored.policy.model, sample) == pytest.approx(
        sequence_logprob(policy.model, sample), abs=1e-5
    )
    # with the optimizer state restored, the next step is identical too
    update.step([sample])
    restored.step([sample])
    assert sequence_logprob(restored.policy.model, sample) == pytest.approx(
        sequence_logprob(policy.model, sample), abs=1e-4
    )


def test_lora_targets_are_filtered_to_existing_modules(tokenizer):
    policy = make_policy(tokenizer, target_modules=["q_proj", "c_attn", "v_proj"])
    assert policy.target_modules == ("q_proj", "v_proj")
    with pytest.raises(ValueError, match=r"none is a linear layer.*q_proj"):
        make_policy(tokenizer, target_modules=["c_attn"])


def test_kl_to_the_base_model_starts_at_zero_with_lora(tokenizer):
    policy = make_policy(tokenizer)
    sample = sample_for(policy.model, tokenizer, TEXTS[0])
    settings = UpdateSettings(learning_rate=1e-2, precision="fp32", loss=LossParams(kl_coef=0.1))
    update = PolicyUpdate(policy, settings)
    first = update.step([sample])
    assert first["train/kl_ref"] == pytest.approx(0.0, abs=1e-7)  # LoRA B = 0: policy == base
    second = update.step([sample])
    assert second["train/kl_ref"] > 0.0


def test_full_finetune_and_bf16_autocast_steps(tokenizer):
    policy = make_policy(tokenizer, lora=False)
    assert all(p.requires_grad for p in policy.model.parameters())
    sample = sample_for(policy.model, tokenizer, TEXTS[0])
    update = PolicyUpdate(policy, UpdateSettings(learning_rate=1e-4, precision="bf16"))
    before = sequence_logprob(policy.model, sample)
    metrics = [update.step([sample]) for _ in range(3)]
    assert all(m["train/grad_norm"] > 0 for m in metrics)
    assert sequence_logprob(policy.model, sample) > before


@pytest.mark.parametrize("recompute", ["off", "on"], ids=["stored", "recomputed"])
def test_lora_layers_under_bf16_autocast_take_their_input_uncast_for_the_same_gradient(tokenizer, monkeypatch,
                                                                                      recompute):
    """peft casts a LoRA layer's input to its fp32 adapter weights' dtype and autocast casts it back for the matmul:
    the step skips both copies, with the same loss and gradient to the bit (activations stored or recomputed in the
    backward pass); after it the layers cast again, as an engine's forward outside autocast needs."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from mtrl_runtime.training.update import _step

    samples = [sample_for(make_policy(tokenizer).model, tokenizer, text) for text in TEXTS[:2]]
    settings = UpdateSettings(precision="bf16", fit_memory=False, gradient_checkpointing=recompute)

    def step(uncast: bool):
        policy = build_policy(tiny_model(tokenizer, seed=0).to(torch.bfloat16), tokenizer, rank=8, alpha=16)
        adapters = [m for m in policy.model.modules() if isinstance(m, BaseTunerLayer)]
        assert adapters and {m.lora_A["default"].weight.dtype for m in adapters} == {torch.float32}
        seen: set[torch.dtype] = set()  # what reaches the adapters' matmuls in the step's forward passes
        for layer in adapters:
            layer.lora_A["default"].register_forward_pre_hook(
                lambda _, args: seen.add(args[0].dtype) if torch.is_autocast_enabled("cpu") else None)
        if not uncast:  # peft's own behaviour, as before
            monkeypatch.setattr(_step, "lora_inputs_uncast", lambda *_: contextlib.nullcontext())
        grads, metrics = step_gradients(tokenizer, samples, settings, policy)
        monkeypatch.undo()
        assert all(layer.cast_input_dtype_enabled for layer in adapters)
        return grads, metrics, seen

    grads, metrics, seen = step(uncast=True)
    cast_grads, cast_metrics, cast_seen = step(uncast=False)
    assert cast_seen == {torch.float32} and seen == {torch.bfloat16}, (cast_seen, seen)
    assert metrics["train/loss"] == cast_metrics["train/loss"]
    assert metrics["train/gradient_checkpointing"] == float(recompute == "on")
    assert grads.keys() == cast_grads.keys() and all(torch.equal(grads[n], cast_grads[n]) for n in grads)
    assert sum(float(g.abs().sum()) for g in grads.values()) > 0


def test_samples_without_model_tokens_do_not_step(tokenizer):
    policy = make_policy(tokenizer)
    sample = sample_for(policy.model, tokenizer, TEXTS[0])
    empty = Sample("r", "g", 0, sample.token_ids_T, (0,) * len(sample.token_ids_T),
                   (0.0,) * len(sample.token_ids_T), (0.0,) * len(sample.token_ids_T),
                   (-1,) * len(sample.token_ids_T))
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32"))
    metrics = update.step([empty])
    assert metrics["train/tokens_trained"] == 0 and update.version == 0


def test_unknown_loss_is_an_error_listing_known_names():
    with pytest.raises(KeyError, match="unknown loss function 'grpo'.*ppo"):
        UpdateSettings(loss_fn="grpo")


def test_checkpoints_keep_the_newest_and_remove_what_a_dead_write_left(tokenizer, tmp_path):
    from mtrl_runtime.store import SQLiteStore
    from mtrl_runtime.training._checkpoint import Checkpoints

    update = PolicyUpdate(make_policy(tokenizer), UpdateSettings(precision="fp32"))
    with SQLiteStore(tmp_path / "trajectories.db") as store:
        checkpoints = Checkpoints(tmp_path, store, keep=3)
        dead = [tmp_path / "checkpoints" / ".step-000004.tmp-abc", tmp_path / "checkpoints" / ".step-000002.old-77"]
        for folder in dead:  # what a SIGKILL mid-write leaves
            (folder / "policy").mkdir(parents=True)
        unrelated = tmp_path / "checkpoints" / "notes.txt"
        unrelated.write_text("mine")
        for step in (2, 4, 6, 8):
            checkpoints.save(step, update, {"epoch": 0, "index": step})
        assert [p.name for p in sorted((tmp_path / "checkpoints").glob("step-*"))] == [
            "step-000004", "step-000006", "step-000008"]
        assert not any(folder.exists() for folder in dead) and unrelated.read_text() == "mine"
        state = Checkpoints(tmp_path, store, keep=3).restore(update)
        assert state.next_step == 8 and state.data_position == {"epoch": 0, "index": 8}
        with pytest.raises(ValueError, match="keep: must be >= 1, got 0"):
            Checkpoints(tmp_path, store, keep=0)


def test_the_training_device_is_cuda_when_present_and_an_unavailable_one_is_named():
    from mtrl_runtime.config import ConfigError, MtrlConfig
    from mtrl_runtime.training import train_device

    assert train_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert train_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="advanced.train_device: 'cuda:1'"):
            train_device("cuda:1")
    with pytest.raises(ConfigError, match="advanced.train_device.*'tpu'"):
        MtrlConfig.from_dict({"advanced": {"train_device": "tpu"}})


SHARED_PROMPT = "You are an inspection agent. Follow the procedure, call one tool per step, then answer. "
ENDINGS = ["The answer is 42.", "Call validate first, then answer DONE.", "The tool said pass; release it now.",
           "Ground the aircraft: an incident is open."]


@pytest.mark.parametrize("kl_coef", [0.0, 0.2])
def test_a_shared_prompt_prefix_runs_once_with_the_same_gradient(tokenizer, kl_coef):
    base = make_policy(tokenizer)
    prompt_len = len(tokenizer(SHARED_PROMPT)["input_ids"]) + 2  # the loss starts inside the endings
    samples = [sample_for(base.model, tokenizer, SHARED_PROMPT + end, prompt_len=prompt_len, advantage=adv)
               for end, adv in zip(ENDINGS, [1.0, -0.5, 2.0, -1.5])]

    def grads(share_prefix):
        settings = UpdateSettings(micro_batch_tokens=10_000, precision="fp32", share_prefix=share_prefix,
                                  loss=LossParams(kl_coef=kl_coef))
        return step_gradients(tokenizer, samples, settings)

    shared, m_shared = grads(True)
    plain, m_plain = grads(False)
    assert m_plain["train/tokens_shared"] == 0
    assert m_shared["train/tokens_shared"] >= 3 * 16
    assert m_shared["train/tokens_forward"] < m_plain["train/tokens_forward"] - m_shared["train/tokens_shared"] / 2
    assert m_shared["train/loss"] == pytest.approx(m_plain["train/loss"], abs=1e-5)
    for name in plain:
        assert torch.allclose(shared[name], plain[name], atol=1e-5, rtol=1e-3), name
    assert any(g.abs().sum() > 0 for g in shared.values())


def test_plan_counts_a_shared_prefix_once():
    from mtrl_runtime.training.update._packing import pack_micro_batches

    rows = [tuple(range(40)) + (100 + i,) * 10 for i in range(4)]  # 40 shared tokens, 10 of each row's own
    lengths = [len(r) for r in rows]
    assert plan_micro_batches(lengths, budget=100) == [[0, 1], [2, 3]]  # 2 x 50 each without sharing
    assert plan_micro_batches(lengths, budget=100, rows=rows) == [[0, 1, 2, 3]]  # 40 + 4 x 10
    assert pack_micro_batches(lengths, budget=100, rows=rows) == [([0, 1, 2, 3], 40)]
    short = [r[:10] for r in rows]  # what may be shared is cut where training starts: 10 tokens, too few
    assert plan_micro_batches(lengths, budget=100, rows=short) == [[0, 1], [2, 3]]


def test_each_step_gives_freed_memory_back(tokenizer, monkeypatch):
    from mtrl_runtime.training.update import _memory

    calls = []
    monkeypatch.setattr(_memory, "release_free_memory", lambda: calls.append(1) or True)
    policy = make_policy(tokenizer)
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32"))
    update.step([sample_for(policy.model, tokenizer, TEXTS[0])])
    update.step([sample_for(policy.model, tokenizer, TEXTS[1])])
    assert len(calls) == 2


def test_release_free_memory_trims_the_heap_on_glibc():
    import platform

    from mtrl_runtime.training.update._memory import release_free_memory

    assert release_free_memory() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


# ---------------------------------------------------------------------- which thread trains
def _recording(update):
    """Wrap ``update.step`` to record the thread each call ran on."""
    threads = []
    step = update.step

    def recorded(samples):
        threads.append(threading.current_thread().name)
        return step(samples)

    update.step = recorded
    return threads


async def test_a_shared_weights_step_runs_on_the_engine_worker_and_serves_the_new_version(tokenizer):
    from mtrl_runtime.engines import HFEngine
    from mtrl_runtime.training import SharedWeights
    from mtrl_runtime.types import GenerationRequest, SamplingParams

    engine = HFEngine.from_objects(tiny_model(tokenizer, seed=0), tokenizer)
    try:
        policy = build_policy(engine.model, tokenizer, rank=8, alpha=16)
        update = PolicyUpdate(policy, UpdateSettings(precision="fp32", learning_rate=1e-2), engine.weights_lock)
        weights = SharedWeights(engine, update)
        threads = _recording(update)
        sample = sample_for(policy.model, tokenizer, TEXTS[1])
        await weights.apply([sample])
        await weights.apply([sample])
        assert threads == ["mtrl-hf-engine", "mtrl-hf-engine"]
        assert engine.policy_version == update.version == 2
        gen = await engine.generate(GenerationRequest(sample.token_ids_T[:4], SamplingParams(max_tokens=3)))
        assert gen.policy_version == 2
    finally:
        await engine.close()


async def test_pushed_weights_train_every_step_on_one_thread(tokenizer, tmp_path):
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.training import PushedWeights

    engine = ScriptedEngine(tokenizer, lambda prompt, request: "ok")
    policy = make_policy(tokenizer)
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32"))
    weights = PushedWeights(engine, update, tmp_path)
    threads = _recording(update)
    sample = sample_for(policy.model, tokenizer, TEXTS[1])
    try:
        for _ in range(3):
            await weights.apply([sample])
    finally:
        weights.close()
    assert len(threads) == 3 and len(set(threads)) == 1 and threads[0].startswith("mtrl-update")
    assert engine.policy_version == 3 and (tmp_path / "adapters" / "v3").is_dir()


PAIRED_ENDINGS = [  # two pairs: each pair shares more than the prompt all four share
    ("Call validate first, then answer DONE.", 1.0), ("Call validate first, then answer 42.", -0.5),
    ("The tool said pass; release it now.", 2.0), ("The tool said pass; ground it now.", -1.5)]


@pytest.mark.parametrize("kl_coef", [0.0, 0.2])
@pytest.mark.parametrize("chunk", [512, 0], ids=["chunked", "whole-logits"])
def test_a_prefix_every_sample_shares_runs_once_per_step_with_the_same_gradient(tokenizer, kl_coef, chunk):
    """Two micro-batches of two rows: the system prompt runs once for the step (its gradient gathered from both
    batches), each pair's longer common opening once per batch on top of it; the gradient is the plain one."""
    base = make_policy(tokenizer)
    prompt = len(tokenizer(SHARED_PROMPT)["input_ids"])
    samples = [sample_for(base.model, tokenizer, SHARED_PROMPT + end, advantage=adv,
                          prompt_len=prompt + (6 if i < 2 else 2)) for i, (end, adv) in enumerate(PAIRED_ENDINGS)]
    longest = max(len(s.token_ids_T) for s in samples)

    def grads(share_prefix):
        settings = UpdateSettings(micro_batch_tokens=prompt + 2 * (longest - prompt), precision="fp32",
                                  share_prefix=share_prefix, logprob_chunk_tokens=chunk,
                                  loss=LossParams(kl_coef=kl_coef), fit_memory=False, gradient_checkpointing="off")
        return step_gradients(tokenizer, samples, settings)

    shared, m_shared = grads(True)
    plain, m_plain = grads(False)
    assert m_shared["train/micro_batches"] == 2
    assert m_shared["train/tokens_step_prefix"] >= prompt - 1 and m_plain["train/tokens_step_prefix"] == 0
    # the step prefix once, each pair's own longer opening once, then each row's rest
    assert m_shared["train/tokens_forward"] < m_plain["train/tokens_forward"] - 2 * prompt
    assert m_shared["train/loss"] == pytest.approx(m_plain["train/loss"], abs=1e-5)
    for name in plain:
        assert torch.allclose(shared[name], plain[name], atol=1e-5, rtol=1e-3), name
    assert sum(float(g.abs().sum()) for g in shared.values()) > 0


def test_the_adapters_initial_weights_follow_the_seed_not_what_ran_before(tokenizer):
    def adapter(seed: int, drawn: int = 0) -> dict[str, torch.Tensor]:
        model = tiny_model(tokenizer, seed=0)
        torch.rand(drawn)  # whatever another part of the process drew
        state = torch.random.get_rng_state()
        policy = build_policy(model, tokenizer, rank=4, alpha=8, seed=seed)
        assert torch.equal(torch.random.get_rng_state(), state)  # the process's random state is left as it was
        return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}

    first, again, other = adapter(0), adapter(0, drawn=1000), adapter(1)
    assert first.keys() == again.keys() and all(torch.equal(first[n], again[n]) for n in first)
    assert any(not torch.equal(first[n], other[n]) for n in first if "lora_A" in n)
