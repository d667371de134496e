"""Onset signals: policy entropy from the recorded logprobs, KL to the reference, and the hack_onset rule.

The rule must fire on a constructed run (entropy or KL rising faster each
window while the reward climbs) and stay silent on a healthy learning run
and on the demo's recorded metrics (bench/results/main_job*.json).
"""

from __future__ import annotations

import glob
import json
import math

import pytest
import torch

from mtrl_runtime.algorithms.losses import LOSSES, LossParams
from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.diagnostics import RULES, History, diagnose, knobs_from_config
from mtrl_runtime.monitor import DiagnosticsMonitor
from mtrl_runtime.training import onset_suspects, rollout_entropy, rollout_metrics
from mtrl_runtime.types import Rollout, RolloutStatus, Turn

KNOBS = knobs_from_config(MtrlConfig())


def _rollout(rid: str, reward: float, logprobs: list[list[float]]) -> Rollout:
    turns = tuple(Turn(rollout_id=rid, index=i, messages=(), prompt_ids=(1,), completion_ids=tuple(range(len(lp))),
                       logprobs=tuple(lp), finish_reason="stop", completion_text="") for i, lp in enumerate(logprobs))
    return Rollout(id=rid, task_id="t", group_id="g", status=RolloutStatus.COMPLETED, turns=turns, reward=reward)


def test_entropy_is_the_mean_surprisal_of_the_sampled_tokens():
    rollouts = [_rollout("a", 1.0, [[-0.5, -1.5], [-1.0]]), _rollout("b", 0.0, [[-0.1, -0.3]]),
                _rollout("c", 1.0, [[-2.0]])]
    m = rollout_metrics(rollouts)
    assert m["policy/entropy"] == pytest.approx((0.5 + 1.5 + 1.0 + 0.1 + 0.3 + 2.0) / 6)
    assert rollout_entropy(rollouts[0]) == pytest.approx(1.0)
    assert onset_suspects(rollouts) == ["c", "a"]  # above the mean reward (2/3), highest entropy first
    assert "policy/entropy" not in rollout_metrics([_rollout("d", 0.0, [])])  # no token: no estimate, not 0


def test_measure_kl_ref_reports_kl_without_changing_the_loss():
    torch.manual_seed(0)
    logp = torch.randn(2, 5) * 0.1 - 1.0
    old, ref = logp + 0.05, logp - 0.2
    adv, mask = torch.ones(2, 5), torch.ones(2, 5)
    plain, m_plain = LOSSES.get("ppo")(logp, old, adv, mask, LossParams())
    measured, m = LOSSES.get("ppo")(logp, old, adv, mask, LossParams(measure_kl_ref=True), ref_logprobs_BT=ref)
    assert torch.equal(plain, measured) and "kl_ref" not in m_plain
    delta = -0.2  # ref - logp
    assert m["kl_ref"] == pytest.approx(math.exp(delta) - delta - 1.0, rel=1e-4)
    assert LossParams(measure_kl_ref=True).needs_reference and not LossParams().needs_reference


def test_measure_kl_ref_is_checked_at_load():
    with pytest.raises(ConfigError, match=r"advanced.measure_kl_ref.*'maybe'"):
        MtrlConfig.from_dict({"advanced": {"measure_kl_ref": "maybe"}})


def _run(reward, entropy=None, kl=None):
    steps = []
    for i, r in enumerate(reward):
        entry = {"step": i, "rollout/reward/mean": r, "analysis/zero_adv_frac": 0.2, "rollout/truncated_frac": 0.0,
                 "failures/permanent_rate": 0.0}
        if entropy is not None:
            entry["policy/entropy"] = entropy[i]
        if kl is not None:
            entry["train/kl_ref"] = kl[i]
        steps.append(entry)
    return steps


FLAT_THEN_UP = [0.30] * 6 + [0.32, 0.45, 0.60]  # the reward climbs in the last window


def test_onset_fires_on_accelerating_entropy_with_reward_and_names_the_rollouts():
    entropy = [0.80, 0.79, 0.80, 0.80, 0.81, 0.80, 0.95, 1.10, 1.30]
    monitor = DiagnosticsMonitor(KNOBS, echo=None)
    found = []
    for entry in _run(FLAT_THEN_UP, entropy=entropy):
        found += monitor.observe(entry["step"], entry, named={"onset": ["r7", "r3"]})
    [d] = [x for x in found if x.rule == "hack_onset"]
    assert "policy/entropy 0.797 -> 0.803 -> 1.117" in d.message and "rising faster each window" in d.message
    assert "rollouts r7, r3" in d.first_fix and d.evidence["rollouts"] == ["r7", "r3"]


def test_onset_fires_on_accelerating_kl_to_the_reference():
    kl = [0.000, 0.001, 0.002, 0.003, 0.004, 0.005, 0.02, 0.05, 0.09]
    d = RULES.get("hack_onset")(History(_run(FLAT_THEN_UP, kl=kl)), KNOBS)
    assert d is not None and "train/kl_ref" in d.message and "policy/entropy" not in d.message


@pytest.mark.parametrize("entropy, kl, reward", [
    # a healthy learning run: reward rises, the policy narrows, its distance from the base grows steadily
    ([1.2 - 0.05 * i for i in range(12)], [0.01 * i for i in range(12)], [0.1 + 0.05 * i for i in range(12)]),
    # entropy jumps but the reward does not move: exploration or a broken sampler, not a hack paying off
    ([0.8] * 6 + [0.95, 1.1, 1.3], None, [0.3] * 9),
    # the reward climbs while entropy rises steadily (no acceleration)
    ([0.8 + 0.03 * i for i in range(9)], None, FLAT_THEN_UP),
    # too few steps to compare three windows
    ([0.8, 1.0, 1.3, 1.7], [0.0, 0.02, 0.06, 0.12], [0.1, 0.2, 0.4, 0.7]),
])
def test_onset_stays_silent(entropy, kl, reward):
    assert RULES.get("hack_onset")(History(_run(reward, entropy=entropy, kl=kl)), KNOBS) is None


def test_onset_stays_silent_on_the_demos_recorded_metrics():
    runs = sorted(glob.glob("bench/results/main_job*.json"))
    assert len(runs) >= 10
    for path in runs:
        recorded = json.load(open(path))["steps"]
        history = [{"step": s["step"], "rollout/reward/mean": s["reward"]} for s in recorded]
        assert [d.rule for d in diagnose(history, KNOBS) if d.rule == "hack_onset"] == [], path


@pytest.mark.timeout(300)
def test_a_training_step_logs_entropy_and_kl_to_the_reference(tmp_path):
    import _lookup_task as lookup

    from mtrl_runtime.training import MultiTurnRLTrainer

    cfg = MtrlConfig.from_dict(lookup.config(tmp_path / "run", max_steps=1, train_batch_size=1, group_size=4,
                                             advanced={"measure_kl_ref": True}))
    result = MultiTurnRLTrainer(agent_env=lookup.agent, training_dataset=lookup.tasks(), config=cfg,
                                engine=lookup.build_engine()).train(progress=False)
    [report] = result.reports
    assert report.metrics["policy/entropy"] > 0
    if report.metrics.get("train/skipped"):
        pytest.skip("the step's group carried no signal: no update ran to measure kl_ref")
    assert report.metrics["train/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the first update starts at the reference
