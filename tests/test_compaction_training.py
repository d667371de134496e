"""A real training run whose episodes compact: Strands and LangChain agents (``_compacting_agents``) driven by the
scripted policy through the trainer's coordinator, a tiny Llama (hidden 64, 2 layers, the tokenizer trained in the
test) updated with LoRA. Each episode compacts at least once; the step trains one sample per episode segment, the
summary turns' segments included (``summary_turns: train``) or left out (``mask``), all carrying the episode's
advantage."""

from __future__ import annotations

import itertools

import pytest
import torch

from _compacting_agents import compacting_policy, langchain_agent, strands_agent, task
from mtrl_runtime.algorithms import GroupRewards, build_samples, compute_advantages, episode_tokens
from mtrl_runtime.algorithms import AdvantageParams
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.training import MultiTurnRLTrainer
from mtrl_runtime.types import BreakReason

pytest.importorskip("strands")
pytest.importorskip("langchain.agents.middleware")

AGENTS = {"strands": strands_agent, "langchain": langchain_agent}


def _alternating():
    """A reward that differs inside each group of two (one episode 1, the other 0), so every group carries signal."""
    counter = itertools.count()
    return lambda text: float("DONE" in text and next(counter) % 2 == 0)


def _train(tmp_path, model_dir, tok, framework: str, summary_turns: str):
    torch.set_num_threads(1)
    config = MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "model": str(model_dir), "group_size": 2, "train_batch_size": 1,
                 "max_steps": 1, "max_turns": 24, "lora_rank": 4, "lora_alpha": 8, "val_every": 0,
                 "sampling_params": {"max_tokens": 64}},
        "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 120, "summary_turns": summary_turns},
    })
    # Strands compacts when the coordinator refuses a prompt over the model's context (650 tokens here)
    engine = ScriptedEngine(tok, compacting_policy, context_length=650 if framework == "strands" else None)
    trainer = MultiTurnRLTrainer(agent_env=AGENTS[framework](_alternating()), training_dataset=[task(0)],
                                 config=config, engine=engine, tracking=False)
    return trainer.train(progress=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("framework,summary_turns", [("strands", "train"), ("langchain", "train"), ("strands", "mask")])
def test_compacting_episodes_train_one_sample_per_segment_with_the_episode_advantage(
        tmp_path, tiny_model_dir, tiny_tok, framework, summary_turns):
    result = _train(tmp_path, tiny_model_dir, tiny_tok, framework, summary_turns)
    [report] = result.reports
    metrics = report.metrics
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        rollouts = store.rollouts()
    finally:
        store.close()
    assert len(rollouts) == 2 and sorted(r.total_reward for r in rollouts) == [0.0, 1.0]
    train = summary_turns == "train"
    segments = 0
    [adv] = compute_advantages("group_based", [GroupRewards.from_rollouts(rollouts)], AdvantageParams())[0]
    for rollout, adv_i in zip(rollouts, adv):
        compactions = [t for t in rollout.turns if t.break_reason is BreakReason.COMPACTED]
        assert compactions, "every episode compacts at least once"
        samples = build_samples(rollout, adv_i, () if train else rollout.summary_turns)
        summary_segments = {t.segment for t in rollout.turns if t.index in rollout.summary_turns}
        kept = {t.segment for t in rollout.turns} - (set() if train else summary_segments)
        assert [s.segment for s in samples] == sorted(kept)  # one sequence per segment of the episode
        linked = {a for s in samples for a, m in zip(s.advantages_T, s.loss_mask_T) if m}
        assert len(linked) == 1 and linked != {0.0}  # one advantage across the compaction boundary
        segments += len(samples)
    figures = [episode_tokens(r, train) for r in rollouts]
    assert metrics["samples/count"] == segments
    assert metrics["samples/breaks/compacted"] == sum(f.compactions for f in figures) >= 2
    assert metrics["compaction/count"] == sum(f.compactions for f in figures)
    assert metrics["compaction/tokens_after_mean"] < metrics["compaction/tokens_before_mean"]
    ratio = sum(f.trained_tokens for f in figures) / sum(f.episode_tokens for f in figures)
    assert metrics["samples/trained_tokens_per_episode_token"] == pytest.approx(ratio) and 0 < ratio < 1
    assert metrics["train/tokens_trained"] == sum(f.trained_tokens for f in figures)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    print(f"{framework} summary_turns={summary_turns}: " + ", ".join(
        f"{k}={metrics[k]:.4g}" for k in sorted(metrics) if k.startswith(("compaction/", "samples/"))))
