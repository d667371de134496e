"""End to end: a tiny random model learns a two-step tool task through the endpoint and a real Strands agent.

The whole stack runs: the trainer starts the coordinator on 127.0.0.1, the
dispatcher runs the ``@rollout`` Strands agent in-process, every model call
goes over HTTP to the OpenAI-compatible endpoint, turns are recorded in
SQLite, samples are built by sequence extension, per-turn advantages are
computed, and the shared-weights hf engine serves each new version. See
``_lookup_task`` for the task design. The run stops once the last three
steps average above 0.85 (typically after 15-25 steps of about a second).
"""

from __future__ import annotations

import time

import pytest
import torch

import _lookup_task as lookup
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.training import MultiTurnRLTrainer


# Most runs learn in 15-25 steps; about one in five needs more than 60 (the sampling order of
# concurrent rollouts varies). Speed is not asserted here: the pytest timeout only bounds a hang.
MAX_STEPS = 100


def _learned(rewards: list[float]) -> bool:
    return len(rewards) >= 3 and sum(rewards[-3:]) / 3 > 0.85


@pytest.mark.timeout(300)
def test_tiny_model_learns_the_lookup_task_with_a_strands_agent(tmp_path):
    torch.set_num_threads(1)  # the engine thread and the update share 2 cores
    started = time.perf_counter()
    rewards: list[float] = []

    def on_step(report):
        rewards.append(report.metrics["rollout/reward/mean"])
        return _learned(rewards)

    trainer = MultiTurnRLTrainer(
        agent_env=lookup.agent,
        training_dataset=lookup.tasks(),
        config=MtrlConfig.from_dict(lookup.config(tmp_path / "run", max_steps=MAX_STEPS)),
        engine=lookup.build_engine(seed=0),
        tracking=False,
    )
    result = trainer.train(progress=False, on_step=on_step)
    elapsed = time.perf_counter() - started

    print(f"rewards per step: {[round(x, 2) for x in rewards]}; {elapsed:.1f} s")
    assert rewards[0] < 0.2
    assert _learned(rewards), f"the reward did not rise above 0.85 within {MAX_STEPS} steps"
    last = result.reports[-1].metrics
    assert last["rollout/metrics/tool_ok"] > 0.8 and last["rollout/metrics/answer_ok"] > 0.6
    assert last["rollout/turns/mean"] == pytest.approx(2.0, abs=0.25)
    assert all(r.metrics["samples/extension_rate"] == 1.0 for r in result.reports)  # one sequence per rollout
    assert all(r.metrics["async/staleness_max"] == 0 for r in result.reports)  # the sync loop is on-policy
    assert result.final_step == len(rewards) and (tmp_path / "run" / "adapter").is_dir()
