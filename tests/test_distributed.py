"""FSDP2 data-parallel training at world size 2 (gloo, CPU) equals the one-process step.

The job is a real ``torchrun`` of ``tests/_fsdp_ranks.py``: two processes,
FSDP2-sharded tiny Qwen3 (hidden 64, 2 layers), LoRA and full fine-tuning,
two steps (the second with an odd number of samples, so one rank runs a
padding pass). Only rank 0 reads the model's weights (the others build it on
the meta device and receive their shards). The loss of each step, the weights after both, the saved
adapter / model and the checkpoint's optimizer state must equal those of
``PolicyUpdate`` in this process on the same samples; so must a step taken
after resuming from that checkpoint under torchrun.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from _groups import processes
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.training import (PolicyUpdate, UpdateSettings, build_policy, check_world_divides, deal_rounds,
                                   join_torchrun, launched_distributed, rank_device)
from mtrl_runtime.types import Sample

pytestmark = processes  # its torchrun job never runs beside another job or a Ray cluster
RANKS = Path(__file__).resolve().parent / "_fsdp_ranks.py"
VOCAB = 300
LR = 1e-2
TOL = dict(rtol=1e-4, atol=1e-6)
# AdamW's first step moves each weight by about lr * sign(grad): a gradient that is float noise in both
# layouts (~1e-9) may move by a different fraction of lr, so single weights are compared to 2% of a step
# (those another summation order alone moves by 1%, ``noise_sensitive``, to half a step: at most 0.1% of
# them) and the mean difference to 1e-4 of a step
WEIGHT_TOL = dict(rtol=1e-4, atol=0.02 * LR)


def tiny_qwen3(folder: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                         max_position_embeddings=512, pad_token_id=0)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


def make_samples(count: int, seed: int) -> list[Sample]:
    """Rows of different lengths sharing a 20-token opening, a prompt part and a trained part each."""
    rng = random.Random(seed)
    opening = tuple(rng.randrange(1, VOCAB) for _ in range(20))
    samples = []
    for i in range(count):
        prompt = rng.randrange(2, 12)
        answer = rng.randrange(4, 30)
        ids = opening + tuple(rng.randrange(1, VOCAB) for _ in range(prompt + answer))
        mask = (0,) * (len(opening) + prompt) + (1,) * answer
        samples.append(Sample(
            rollout_id=f"r{seed}-{i}", group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
            behaviour_logprobs_T=tuple(-rng.uniform(4.0, 7.0) if m else 0.0 for m in mask),
            advantages_T=tuple((1.0 if i % 2 else -0.5) if m else 0.0 for m in mask),
            policy_version_T=tuple(0 if m else -1 for m in mask),
        ))
    return samples


def one_process(model: Path, steps: list[list[Sample]], lora: bool, **layout: Any) -> tuple[list[dict], dict,
                                                                                              PolicyUpdate]:
    torch.manual_seed(1234)  # rank 0's seed in _fsdp_ranks: the same LoRA initialisation
    policy = build_policy(model, lora=lora, rank=4, alpha=8, device="cpu")
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32", learning_rate=LR, **layout))
    metrics = [update.step(samples) for samples in steps]
    state = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    return metrics, state, update


def noise_sensitive(model: Path, steps: list[list[Sample]], lora: bool, state: dict) -> dict[str, torch.Tensor]:
    """The weights another summation order alone moves by half the tolerance: one process again, each row its
    own micro-batch and no shared prefix. Those are the elements whose first-step gradient was float noise
    (~1e-9, below AdamW's eps), where the step's size follows the noise, and what that moved in the next
    step; which of them a layout's noise moves past 2% of a step depends on the CPU's kernels (an AVX512
    Xeon moved one, an AVX2 EPYC none)."""
    _, other, _ = one_process(model, steps, lora, micro_batch_tokens=64, share_prefix=False)
    return {name: (other[name] - value).abs() > WEIGHT_TOL["atol"] / 2 for name, value in state.items()}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    case = tmp_path_factory.mktemp("fsdp")
    model = tiny_qwen3(case / "model")
    steps = [make_samples(6, seed=1), make_samples(5, seed=2)]
    torch.save(steps, case / "steps.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
           str(RANKS), str(case)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return case, model, steps


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_world_size_2_equals_one_process(job, kind):
    case, model, steps = job
    ranks = torch.load(case / f"{kind}.pt", weights_only=False)
    metrics, state, update = one_process(model, steps, lora=kind == "lora")
    for step, (mine, theirs) in enumerate(zip(ranks["metrics"], metrics)):
        assert mine["train/world_size"] == 2.0
        assert mine["train/tokens_trained"] == theirs["train/tokens_trained"] > 0
        assert mine["train/policy_version"] == step + 1
        assert mine["train/loss"] == pytest.approx(theirs["train/loss"], rel=1e-4, abs=1e-6), step
        assert mine["train/grad_norm"] == pytest.approx(theirs["train/grad_norm"], rel=1e-4), step
        assert mine["train/ratio_mean"] == pytest.approx(theirs["train/ratio_mean"], rel=1e-4), step
    gathered = ranks["state"]
    assert set(gathered) == set(state)
    moved = 0
    before = initial_weights(model, kind)
    sensitive = noise_sensitive(model, steps, kind == "lora", state)
    assert sum(int(m.sum()) for m in sensitive.values()) <= 1e-3 * sum(v.numel() for v in state.values())
    for name, value in state.items():
        steady = ~sensitive[name]
        torch.testing.assert_close(gathered[name][steady], value[steady], **WEIGHT_TOL, msg=name)
        torch.testing.assert_close(gathered[name], value, rtol=0, atol=0.5 * LR, msg=name)  # no step gone astray
        assert float((gathered[name] - value).abs().mean()) < 1e-4 * LR, name
        moved += int(float((value - before[name]).abs().mean()) > 0.1 * LR)
    assert moved == len(state)  # the steps changed the weights: the comparison is not between two untouched models

    # what the leader saved loads into a one-process policy with the same weights
    torch.manual_seed(99)
    fresh = build_policy(model, lora=kind == "lora", rank=4, alpha=8, device="cpu")
    fresh.load_weights(case / f"{kind}-weights")
    for name, param in fresh.model.named_parameters():
        if name in state:
            torch.testing.assert_close(param.detach(), gathered[name], **TOL, msg=name)

    # the checkpoint is a one-process checkpoint: its optimizer moments are those of the one-process run
    fresh_update = PolicyUpdate(fresh, UpdateSettings(precision="fp32", learning_rate=LR))
    fresh_update.load_checkpoint(case / f"{kind}-checkpoint")
    assert fresh_update.version == 2
    for mine, theirs in zip(fresh_update.optimizer.state_dict()["state"].values(),
                            update.optimizer.state_dict()["state"].values()):
        torch.testing.assert_close(mine["exp_avg"], theirs["exp_avg"], **TOL)
        torch.testing.assert_close(mine["exp_avg_sq"], theirs["exp_avg_sq"], rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_resume_under_torchrun_equals_resume_in_one_process(job, kind):
    """The world-size-2 checkpoint loaded into a freshly sharded policy (rank 0 reads it, each rank keeps its
    shard) and stepped again equals the same checkpoint loaded and stepped in one process: the weights and the
    optimizer moments (AdamW's step after the load depends on them) were both restored."""
    case, model, steps = job
    resumed = torch.load(case / f"{kind}-resumed.pt", weights_only=False)
    torch.manual_seed(99)
    policy = build_policy(model, lora=kind == "lora", rank=4, alpha=8, device="cpu")
    update = PolicyUpdate(policy, UpdateSettings(precision="fp32", learning_rate=LR))
    update.load_checkpoint(case / f"{kind}-checkpoint")
    assert resumed["version_loaded"] == update.version == 2
    theirs = update.step(steps[0])
    mine = resumed["metrics"]
    assert mine["train/policy_version"] == theirs["train/policy_version"] == 3
    assert mine["train/loss"] == pytest.approx(theirs["train/loss"], rel=1e-4, abs=1e-6)
    assert mine["train/grad_norm"] == pytest.approx(theirs["train/grad_norm"], rel=1e-4)
    state = {n: p.detach() for n, p in policy.model.named_parameters() if p.requires_grad}
    assert set(resumed["state"]) == set(state)
    for name, value in state.items():
        torch.testing.assert_close(resumed["state"][name], value, **WEIGHT_TOL, msg=name)


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_only_rank_0_reads_the_weights(job, kind):
    """Rank 1 built the model on the meta device: it opened no weight file and held no parameter memory before
    sharding, then only its shards (about half the model); its embeddings stay tied to the head and its
    non-persistent buffers (rotary inv_freq, left uninitialised by to_empty) are those of a real load."""
    from transformers import Qwen3ForCausalLM

    case, model, _ = job
    leader = torch.load(case / f"{kind}-rank0.pt", weights_only=False)
    follower = torch.load(case / f"{kind}-rank1.pt", weights_only=False)
    assert any(read.startswith("from_pretrained") for read in leader["reads"]), leader["reads"]  # the hook works
    assert any(read.endswith(".safetensors") for read in leader["reads"]), leader["reads"]
    assert follower["reads"] == []
    assert follower["held_before_shard"] == 0
    whole = sum(p.numel() * p.element_size() for p in Qwen3ForCausalLM.from_pretrained(model).parameters())
    assert 0.4 * whole < follower["held_after"] < 0.6 * whole, (follower["held_after"], whole)
    assert leader["tied"] and follower["tied"]
    real = dict(Qwen3ForCausalLM.from_pretrained(model).named_buffers())
    assert set(follower["buffers"]) == set(real) and "model.rotary_emb.inv_freq" in real
    for name, value in real.items():
        torch.testing.assert_close(follower["buffers"][name], value, rtol=0, atol=0, msg=name)


def test_the_reference_copy_on_rank_1_is_the_loaded_model(job):
    """Full fine-tuning with a KL term keeps an unsharded frozen copy: rank 1 fills it whole from rank 0's
    weights and buffers, its embeddings tied to its head as in the loaded model."""
    from transformers import Qwen3ForCausalLM

    case, model, _ = job
    held = torch.load(case / "reference-rank1.pt", weights_only=False)
    real = Qwen3ForCausalLM.from_pretrained(model)
    assert held["tied"]
    assert set(held["state"]) == set(real.state_dict()) and set(held["buffers"]) == set(dict(real.named_buffers()))
    for name, value in [*real.state_dict().items(), *real.named_buffers()]:
        torch.testing.assert_close(held["state"].get(name, held["buffers"].get(name)), value, rtol=0, atol=0,
                                   msg=name)


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_the_fit_check_counts_one_rank_share(job, kind):
    """Before loading (``folder_plan``) and after sharding (the rank's own estimate), a rank counts its shards
    of the weights and of the gradients + AdamW state, plus the whole weights FSDP gathers at once; so a free
    memory that holds one rank's share but not the whole model passes at world size 2 and fails in one process."""
    from mtrl_runtime.training import StepDoesNotFit, folder_plan
    from mtrl_runtime.training.update import check_fits

    from transformers import Qwen3Config, Qwen3ForCausalLM

    case, model, _ = job
    deep = case / f"deep-{kind}"  # a config only: the plan counts on the meta device; 16 layers, so that two
    Qwen3Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=16,  # gathered at
                num_attention_heads=4, num_key_value_heads=2, head_dim=32).save_pretrained(deep)  # once are few
    config = MtrlConfig.from_dict({"core": {"model": str(deep), "lora_rank": 4},
                                   "advanced": {"full_finetune": kind == "full", "train_device": "cpu",
                                                "precision": "fp32", "gradient_checkpointing": "off"}})
    whole, share = folder_plan(config, deep), folder_plan(config, deep, world_size=2)
    assert share.parameters == -(-whole.parameters // 2) and share.trainable == -(-whole.trainable // 2)
    assert share.weights == pytest.approx(whole.weights / 2, abs=1) and share.optimizer == whole.optimizer // 2
    assert whole.gathered == 0 and 0 < share.gathered < whole.weights
    need_whole = whole.need(64, loaded=False, optimizer_ready=False)
    need_share = share.need(64, loaded=False, optimizer_ready=False)
    assert need_share < need_whole
    free = int((need_share + need_whole) / 2 / 0.9)  # check_fits plans on 90% of the free memory
    check_fits(share, 64, free, torch.device("cpu"), loaded=False)
    with pytest.raises(StepDoesNotFit, match="does not fit in cpu memory"):
        check_fits(whole, 64, free, torch.device("cpu"), loaded=False)
    # the sharded rank's own estimate (PolicyUpdate.check_fits) counts its shards, not the whole model
    every = sum(p.numel() for p in Qwen3ForCausalLM.from_pretrained(model).parameters())
    built = torch.load(case / f"{kind}-rank1.pt", weights_only=False)["estimate"]
    assert 0.4 * every < built["parameters"] < 0.6 * every and built["gathered"] > 0


def test_an_explicit_gpu_under_torchrun_is_refused_before_joining():
    environ = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    config = MtrlConfig.from_dict({"core": {"train_batch_size": 2, "group_size": 2},
                                   "advanced": {"train_device": "cuda:0"}})
    with pytest.raises(ValueError, match=r"advanced.train_device: 'cuda:0' under torchrun would put every rank on "
                                         r"that one device; each rank trains on cuda:LOCAL_RANK: set "
                                         r"advanced.train_device to cuda"):
        join_torchrun(config, environ)
    assert not torch.distributed.is_initialized()


def test_each_rank_trains_on_its_own_device():
    assert rank_device("cpu", 3) == torch.device("cpu")
    if torch.cuda.is_available():
        assert rank_device("auto", 0) == torch.device("cuda", 0)
    else:
        assert rank_device("auto", 1) == torch.device("cpu")
        with pytest.raises(ValueError, match=r"LOCAL_RANK 1 needs cuda:1, but torch sees 0 CUDA device"):
            rank_device("cuda", 1)


def initial_weights(model: Path, kind: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    policy = build_policy(model, lora=kind == "lora", rank=4, alpha=8, device="cpu")
    return {n: p.detach() for n, p in policy.model.named_parameters() if p.requires_grad}


def test_world_size_that_does_not_divide_the_batch_is_refused():
    check_world_divides(64, 4)
    with pytest.raises(ValueError, match=r"world size 3 does not divide the batch of 64 rollouts"):
        check_world_divides(64, 3)


def test_rounds_deal_one_sample_per_rank_longest_first():
    assert deal_rounds([5, 9, 7, 3, 8], 2) == [[1, 4], [2, 0], [3]]
    assert deal_rounds([], 2) == []
    assert launched_distributed({"WORLD_SIZE": "2"}) and not launched_distributed({})


def test_a_follower_exits_with_its_output_flushed_and_without_the_interpreters_shutdown(tmp_path):
    # exit_rank's os._exit: buffered output (a pipe, as under torchrun) still arrives, the status is kept,
    # and nothing of the shutdown runs (an atexit handler stands for it), so gloo's threads cannot abort it
    script = ("import atexit, pathlib, sys\n"
              "from mtrl_runtime.training import exit_rank\n"
              f"atexit.register(lambda: pathlib.Path({str(tmp_path / 'shutdown-ran')!r}).touch())\n"
              "print('rank 1 left the job', end='')\n"
              "sys.stderr.write('and said so on stderr')\n"
              "exit_rank(3)\n"
              "print('never printed')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (3, "rank 1 left the job", "and said so on stderr")
    assert not (tmp_path / "shutdown-ran").exists()
