"""On-policy distillation: the distill loss by hand, the teacher's loading and checks, and steps toward the teacher.

Models are the tiny Llama (hidden 64, 2 layers) over the byte-level BPE
tokenizer trained in the test (``mtrl_runtime.testing``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mtrl_runtime.algorithms import LOSSES, LossParams
from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.training import PolicyUpdate, UpdateSettings, build_policy, load_teacher
from mtrl_runtime.types import Sample

PROMPTS = ["You are a helpful assistant.", "What is the value for key A1?", "Call the tool, then answer."]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory, tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("base")
    tiny_model(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def other_model_folder(tmp_path_factory, tokenizer) -> Path:
    """A model of the same tokenizer and another seed."""
    folder = tmp_path_factory.mktemp("other")
    tiny_model(tokenizer, seed=7).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# -- the loss by hand ------------------------------------------------------------


def test_distill_loss_matches_a_hand_computation():
    lp = [[-1.0, -2.0, -0.5], [-3.0, -0.1, -1.5]]
    old = [[-1.2, -2.0, -0.4], [-3.0, -0.3, -1.5]]
    teacher = [[-0.5, -2.5, -0.5], [-1.0, -0.2, -4.0]]
    adv = [[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]]
    mask = [[1, 1, 0], [1, 1, 1]]
    coef, rl = 0.7, 0.3
    logprobs = torch.tensor(lp, requires_grad=True)
    loss, metrics = LOSSES.get("distill")(
        logprobs, torch.tensor(old), torch.tensor(adv), torch.tensor(mask, dtype=torch.float32),
        LossParams(distill_coef=coef, distill_rl_coef=rl), teacher_logprobs_BT=torch.tensor(teacher))
    loss.backward()
    cells = [(b, t) for b in range(2) for t in range(3) if mask[b][t]]
    n = len(cells)
    # A'_t = rl * A_t - coef * (lp_t - teacher_t); loss = -mean(r_t A'_t), r_t = exp(lp_t - old_t)
    shaped = {c: rl * adv[c[0]][c[1]] - coef * (lp[c[0]][c[1]] - teacher[c[0]][c[1]]) for c in cells}
    ratio = {c: math.exp(lp[c[0]][c[1]] - old[c[0]][c[1]]) for c in cells}
    expected = -sum(ratio[c] * shaped[c] for c in cells) / n
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    # the teacher term is a detached advantage: d loss / d lp_t = -r_t * A'_t / n, and 0 on masked tokens
    grad = logprobs.grad
    for b in range(2):
        for t in range(3):
            want = -ratio[(b, t)] * shaped[(b, t)] / n if mask[b][t] else 0.0
            assert float(grad[b, t]) == pytest.approx(want, rel=1e-6, abs=1e-9)
    kl = sum(lp[b][t] - teacher[b][t] for b, t in cells) / n
    assert metrics["distill_reverse_kl"] == pytest.approx(kl, rel=1e-6)
    assert metrics["teacher_logprob"] == pytest.approx(sum(teacher[b][t] for b, t in cells) / n, rel=1e-6)


def test_distill_alone_ignores_the_rl_advantage():
    lp, teacher = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-0.5, -3.0]])
    mask = torch.ones(1, 2)
    params = LossParams(distill_coef=1.0)  # distill_rl_coef 0: distillation alone
    a, _ = LOSSES.get("distill")(lp, lp, torch.tensor([[5.0, 5.0]]), mask, params, teacher_logprobs_BT=teacher)
    b, _ = LOSSES.get("distill")(lp, lp, torch.tensor([[-9.0, 0.0]]), mask, params, teacher_logprobs_BT=teacher)
    assert float(a) == float(b) == pytest.approx(-((-1.0 + 0.5) * -1 + (-2.0 + 3.0) * -1) / 2)


def test_distill_loss_without_a_teacher_says_which_field():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="advanced.distill_teacher"):
        LOSSES.get("distill")(x, x, x, torch.ones(1, 2), LossParams(distill_coef=1.0))
    with pytest.raises(ValueError, match="distill_coef must be >= 0, got -1"):
        LossParams(distill_coef=-1.0)


# -- the config ------------------------------------------------------------------


def test_config_checks_the_distill_fields(tmp_path, base_folder):
    with pytest.raises(ConfigError, match=r"core.loss_fn: 'distill' needs advanced.distill_teacher"):
        MtrlConfig.from_dict({"core": {"loss_fn": "distill"}})
    with pytest.raises(ConfigError, match=r"advanced.distill_teacher: '.*nowhere' is not a folder"):
        MtrlConfig.from_dict({"core": {"loss_fn": "distill"}, "advanced": {"distill_teacher": str(tmp_path / "nowhere")}})
    with pytest.raises(ConfigError, match=r"holds neither adapter_config.json"):
        MtrlConfig.from_dict({"core": {"loss_fn": "distill"}, "advanced": {"distill_teacher": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"core.loss_fn is 'ppo'; the teacher is read only by core.loss_fn: distill"):
        MtrlConfig.from_dict({"advanced": {"distill_teacher": str(base_folder)}})
    with pytest.raises(ConfigError, match="distill_coef"):
        MtrlConfig.from_dict({"core": {"loss_fn": "distill"},
                              "advanced": {"distill_teacher": str(base_folder), "distill_coef": 0}})
    config = MtrlConfig.from_dict({"core": {"loss_fn": "distill"},
                                   "advanced": {"distill_teacher": str(base_folder), "distill_rl_coef": 0.5}})
    params = LossParams.from_config(config.advanced)
    assert params.needs_teacher and params.distill_coef == 1.0 and params.distill_rl_coef == 0.5
    assert not LossParams.from_config(MtrlConfig().advanced).needs_teacher


# -- the teacher -----------------------------------------------------------------


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_token(tmp_path, tokenizer):
    other = tiny_tokenizer(extra_corpus=["zebra zebra quokka quokka"])
    folder = tmp_path / "foreign"
    tiny_model(other, seed=1).save_pretrained(folder)
    other.save_pretrained(folder)
    with pytest.raises(ValueError, match=r"advanced.distill_teacher: '.*foreign' has a tokenizer unlike core.model's"):
        load_teacher(folder, None, tokenizer, torch.device("cpu"))


def test_update_refuses_a_missing_or_unwanted_teacher(tokenizer, other_model_folder):
    policy = build_policy(tiny_model(tokenizer, seed=0), tokenizer, rank=8, alpha=16)
    with pytest.raises(ValueError, match="needs a teacher"):
        PolicyUpdate(policy, UpdateSettings(loss_fn="distill", loss=LossParams(distill_coef=1.0)))
    teacher = load_teacher(other_model_folder, None, tokenizer, policy.device)
    with pytest.raises(ValueError, match="takes no teacher"):
        PolicyUpdate(policy, UpdateSettings(loss_fn="ppo"), teacher=teacher)


def _samples(model, tokenizer, generator: torch.Generator, per_prompt: int = 4, new: int = 10) -> list[Sample]:
    """Completions sampled from ``model`` itself (temperature 1), with its logprobs as behaviour: on-policy."""
    out = []
    for p, prompt in enumerate(PROMPTS):
        prompt_ids = tokenizer(prompt)["input_ids"]
        for i in range(per_prompt):
            ids, logps = list(prompt_ids), []
            with torch.no_grad():
                for _ in range(new):
                    logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                    probs = logits.softmax(-1)
                    token = int(torch.multinomial(probs, 1, generator=generator))
                    logps.append(float(probs[token].log()))
                    ids.append(token)
            n, k = len(ids), len(prompt_ids)
            out.append(Sample(
                rollout_id=f"r{p}-{i}", group_id=f"g{p}", segment=0, token_ids_T=tuple(ids),
                loss_mask_T=(0,) * k + (1,) * new, behaviour_logprobs_T=(0.0,) * k + tuple(logps),
                advantages_T=(0.0,) * n, policy_version_T=(-1,) * k + (0,) * new))
    return out


def _exact_reverse_kl(student, teacher, tokenizer) -> float:
    """KL(student || teacher) summed over the vocabulary, averaged over every next-token position of PROMPTS."""
    total, count = 0.0, 0
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            s = student(input_ids=ids).logits[0].float().log_softmax(-1)
            t = teacher(input_ids=ids).logits[0].float().log_softmax(-1)
            total += float((s.exp() * (s - t)).sum())
            count += s.shape[0]
    return total / count


def _demo(tokenizer, text: str) -> Sample:
    """``text`` as a demonstration (advantage 1 on every token but the first): what ``mtrl sft`` trains on."""
    ids = tuple(tokenizer(text)["input_ids"])
    n = len(ids)
    return Sample(rollout_id=text[:8], group_id="g", segment=0, token_ids_T=ids, loss_mask_T=(0,) + (1,) * (n - 1),
                  behaviour_logprobs_T=(0.0,) * n, advantages_T=(1.0,) * n, policy_version_T=(0,) * n)


def _trained_teacher(kind: str, base_folder: Path, folder: Path, tokenizer) -> Path:
    """A teacher fine-tuned (nll, LoRA) on PROMPTS + an answer: the adapter folder, or (``model``) the adapter
    merged into a whole model folder with the tokenizer, as a separately published model of the family is."""
    trained = build_policy(base_folder, rank=8, alpha=16, seed=3, device="cpu")
    update = PolicyUpdate(trained, UpdateSettings(loss_fn="nll", learning_rate=0.2, precision="fp32",
                                                  fit_memory=False))
    for _ in range(15):
        update.step([_demo(tokenizer, p + " The answer is 42.") for p in PROMPTS])
    if kind == "adapter":
        return trained.save_weights(folder)
    trained.model.merge_and_unload().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind", ["adapter", "model"])
def test_distill_steps_move_the_student_toward_the_teacher(tmp_path, tokenizer, base_folder, kind):
    """A few steps on the student's own samples lower the exact reverse KL to the teacher, by a margin."""
    torch.manual_seed(0)
    torch.set_num_threads(1)  # 2 shared cores: more threads only contend
    folder = _trained_teacher(kind, base_folder, tmp_path / "teacher", tokenizer)
    teacher = load_teacher(folder, base_folder if kind == "adapter" else None, tokenizer, torch.device("cpu"))
    assert teacher.kind == kind
    assert not any(p.requires_grad for p in teacher.model.parameters())
    policy = build_policy(base_folder, rank=8, alpha=16, seed=0, device="cpu")
    settings = UpdateSettings(loss_fn="distill", loss=LossParams(distill_coef=1.0), learning_rate=5e-2,
                              precision="fp32", fit_memory=False)
    update = PolicyUpdate(policy, settings, teacher=teacher)
    before = _exact_reverse_kl(policy.model, teacher.model, tokenizer)
    generator = torch.Generator().manual_seed(0)
    estimates = []
    for _ in range(8):
        metrics = update.step(_samples(policy.model, tokenizer, generator))
        estimates.append(metrics["train/distill_reverse_kl"])
        assert metrics["train/teacher_logprob"] < 0
    after = _exact_reverse_kl(policy.model, teacher.model, tokenizer)
    print(f"{kind}: exact reverse KL {before:.4f} -> {after:.4f}; sampled estimate {[round(e, 3) for e in estimates]}")
    assert before > 0.01
    assert after < 0.5 * before
    assert not any(p.grad is not None for p in teacher.model.parameters())  # frozen: scored, never trained


# -- through the trainer -----------------------------------------------------------


@pytest.mark.timeout(300)
def test_trainer_distills_from_a_teacher_folder_on_the_lookup_task(tmp_path):
    """mtrl's trainer with loss_fn distill: the teacher is loaded, scored each step, and groups without RL signal
    (every reward equal) still train, on the teacher's term alone."""
    import _lookup_task as lookup
    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    teacher = lookup.save_model(tmp_path / "teacher", seed=5)
    config = MtrlConfig.from_dict(lookup.config(
        tmp_path / "run", max_steps=3, loss_fn="distill", advantage_method="group_based",
        advanced={"distill_teacher": str(teacher)}))
    trainer = MultiTurnRLTrainer(agent_env=lookup.agent, training_dataset=lookup.tasks(), config=config,
                                 engine=lookup.build_engine(seed=0), tracking=False)
    result = trainer.train(progress=False)
    reports = [r.metrics for r in result.reports]
    assert len(reports) == 3
    for m in reports:
        assert m["train/teacher_logprob"] < 0 and "train/distill_reverse_kl" in m
        assert m["samples/count"] > 0 and m.get("train/skipped", 0.0) == 0.0
    # a group whose rollouts all scored alike has no RL signal, yet it was trained (the teacher's term)
    assert any(m["analysis/zero_adv_groups"] > 0 for m in reports), reports


def test_trainer_refuses_a_teacher_of_another_tokenizer_before_the_first_rollout(tmp_path, other_model_folder):
    import _lookup_task as lookup
    from mtrl_runtime.training import MultiTurnRLTrainer

    config = MtrlConfig.from_dict(lookup.config(tmp_path / "run", max_steps=1, loss_fn="distill",
                                                advanced={"distill_teacher": str(other_model_folder)}))
    with pytest.raises(ConfigError, match=r"advanced.distill_teacher: '.*' has a tokenizer unlike core.model's"):
        MultiTurnRLTrainer(agent_env=lookup.agent, training_dataset=lookup.tasks(), config=config,
                           engine=lookup.build_engine(seed=0), tracking=False).train(progress=False)
