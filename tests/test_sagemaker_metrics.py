"""Every metric that carries a SageMaker AI MTRL name computes SageMaker's meaning, on a batch computed by hand.

The batch (group_based advantages, three groups of two kept rollouts, one failed rollout besides):

    group   rewards (kept)   advantages      turn tokens per rollout
    g1      1.0, 0.0         +, -            [3, 5], [7]
    g2      1.0, 1.0         all zero        [2], [2]
    g3      0.5, 0.0         +, -            [2], [2]   (+ a failed rollout, reward defaulted to 0, no turns)

    rollout/reward/mean          (1 + 0 + 1 + 1 + 0.5 + 0 + 0) / 7          = 0.5
    rollout/reward/valid_mean    groups with non-zero advantage: (1 + 0 + 0.5 + 0) / 4 = 0.375   (SageMaker)
    rollout/reward/reported_mean completed, reward reported: 3.5 / 6                              (mtrl)
    rollout/tokens/response_max  the longest single response: 7                                  (SageMaker)
    rollout/tokens/rollout_max   the most tokens one rollout generated: 3 + 5 = 8                (mtrl)
    analysis/zero_adv_groups     groups whose advantages are all zero: 1 (g2)                    (SageMaker)
    analysis/zero_adv_frac       their share of the kept groups: 1/3                             (mtrl)
"""

from __future__ import annotations

import pytest

from mtrl_runtime.algorithms import AdvantageParams
from mtrl_runtime.diagnostics import RULES, History, diagnose, knobs_from_config
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.evaluation import eval_metrics, record_of
from mtrl_runtime.rescore import step_signal
from mtrl_runtime.rollouts import GroupResult
from mtrl_runtime.types import Rollout, RolloutStatus, Task, Turn


def _turns(rollout_id: str, lengths: list[int]) -> tuple[Turn, ...]:
    turns, prompt = [], (1, 2, 3)
    for i, n in enumerate(lengths):
        completion = tuple(range(100, 100 + n))
        turns.append(Turn(rollout_id=rollout_id, index=i, messages=(), prompt_ids=prompt, completion_ids=completion,
                          logprobs=(-0.5,) * n, finish_reason="stop", completion_text=""))
        prompt = prompt + completion + (9,)  # the next turn extends this one (a tool result in between)
    return tuple(turns)


def _rollout(rid: str, group: str, reward: float, lengths: list[int]) -> Rollout:
    return Rollout(id=rid, task_id=group, group_id=group, status=RolloutStatus.COMPLETED,
                   turns=_turns(rid, lengths), reward=reward)


def batch() -> list[GroupResult]:
    g1 = (_rollout("a1", "g1", 1.0, [3, 5]), _rollout("a2", "g1", 0.0, [7]))
    g2 = (_rollout("b1", "g2", 1.0, [2]), _rollout("b2", "g2", 1.0, [2]))
    g3 = (_rollout("c1", "g3", 0.5, [2]), _rollout("c2", "g3", 0.0, [2]))
    failed = Rollout(id="c3", task_id="g3", group_id="g3", status=RolloutStatus.FAILED, reward=0.0,
                     reward_defaulted=True, error="tool raised")
    return [GroupResult(g, Task(id=g), kept, kept + extra, dropped=False)
            for g, kept, extra in (("g1", g1, ()), ("g2", g2, ()), ("g3", g3, (failed,)))]


@pytest.fixture(scope="module")
def metrics() -> dict[str, float]:
    # step_signal composes a step's metrics exactly as the training loop does (rollout_metrics + prepare_batch)
    return step_signal(0, batch(), "group_based", AdvantageParams(), version=0, max_off_policy=0).metrics


def test_valid_mean_is_over_groups_with_nonzero_advantage(metrics):
    assert metrics["rollout/reward/valid_mean"] == pytest.approx(0.375)
    assert metrics["rollout/reward/mean"] == pytest.approx(0.5)


def test_reported_mean_keeps_mtrls_meaning_under_its_own_name(metrics):
    assert metrics["rollout/reward/reported_mean"] == pytest.approx(3.5 / 6)


def test_valid_mean_is_absent_when_no_group_carries_signal():
    same = [GroupResult("g2", Task(id="g2"), batch()[1].kept, batch()[1].kept, dropped=False)]
    m = step_signal(0, same, "group_based", AdvantageParams(), version=0, max_off_policy=0).metrics
    assert "rollout/reward/valid_mean" not in m and m["rollout/reward/mean"] == 1.0


def test_response_max_is_per_turn_and_rollout_max_per_rollout(metrics):
    assert metrics["rollout/tokens/response_max"] == 7.0
    assert metrics["rollout/tokens/response_mean"] == pytest.approx((3 + 5 + 7 + 2 * 4) / 7)
    assert metrics["rollout/tokens/rollout_max"] == 8.0
    assert metrics["rollout/tokens/rollout_mean"] == pytest.approx((8 + 7 + 2 * 4 + 0) / 7)


def test_zero_adv_groups_counts_groups_and_zero_adv_frac_is_their_share(metrics):
    assert metrics["analysis/zero_adv_groups"] == 1.0
    assert metrics["analysis/zero_adv_frac"] == pytest.approx(1 / 3)


def test_pass_k_is_the_unbiased_estimator_over_reward_at_the_success_threshold():
    # t1: 1 success in 4 (0.9 >= threshold 0.8; 0.7 is not), t2: 2 in 4
    rewards = {"t1": [0.9, 0.7, 0.0, 0.0], "t2": [1.0, 0.8, 0.1, 0.0]}
    records = [record_of(Rollout(id=f"{t}{i}", task_id=t, group_id=t, status=RolloutStatus.COMPLETED, reward=r), 0.8)
               for t, rs in rewards.items() for i, r in enumerate(rs)]
    m = eval_metrics(records, [1, 2, 4, 8])
    # pass@k = 1 - C(n-c, k) / C(n, k), averaged over tasks
    assert m["val/reward/pass_k_1"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert m["val/reward/pass_k_2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert m["val/reward/pass_k_4"] == pytest.approx(1.0)
    assert "val/reward/pass_k_8" not in m  # undefined with 4 samples per task: left out, never guessed


def test_stall_rule_reads_valid_mean_in_sagemakers_meaning():
    """valid_mean below mean (the groups without signal are the solved ones) turns the stall fix to harder tasks."""
    rewards = [0.1 + 0.4 * i / 9 for i in range(10)] + [0.5 + 0.004 * (-1) ** i for i in range(15)]
    steps = [{"step": i, "rollout/reward/mean": r, "analysis/zero_adv_frac": 0.2, "rollout/truncated_frac": 0.0,
              "failures/permanent_rate": 0.0, "rollout/reward/valid_mean": r - 0.2} for i, r in enumerate(rewards)]
    knobs = knobs_from_config(MtrlConfig())
    d = RULES.get("stall_with_healthy_knobs")(History(steps), knobs)
    assert d is not None and "valid_mean sits 0.20 below the mean" in d.message
    assert d.first_fix.startswith("add harder tasks") and d.evidence["valid_mean_gap"] == pytest.approx(0.2)
    level = [{**s, "rollout/reward/valid_mean": s["rollout/reward/mean"]} for s in steps]
    found = [x for x in diagnose(level, knobs) if x.rule == "stall_with_healthy_knobs"]
    assert found and found[0].first_fix.startswith("double the LoRA capacity")
