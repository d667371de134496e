"""Each advantage method against values computed by hand."""

import math

import pytest

from mtrl_runtime.algorithms import ADVANTAGES, AdvantageParams, GroupRewards, compute_advantages
from mtrl_runtime.types import Rollout, RolloutStatus, Turn

P = AdvantageParams()


def group(rewards, turns=None, lengths=None, turn_rewards=None, gid="g"):
    n = len(rewards)
    return GroupRewards(
        rewards_G=tuple(float(r) for r in rewards),
        num_turns_G=tuple(turns or [1] * n),
        lengths_G=tuple(lengths or [10] * n),
        turn_rewards_G=turn_rewards,
        group_id=gid,
    )


def scalars(advantages):
    """First-turn advantage of each rollout of the first group."""
    return [turns[0] for turns in advantages[0]]


def test_registry_has_the_sagemaker_names():
    assert ADVANTAGES.names() == sorted([
        "group_based", "group_based_per_turn", "rloo", "grpo_passk", "reinforce_pp",
        "reinforce_pp_baseline", "opo", "gpg", "monte_carlo",
    ])


def test_group_based_is_grpo():
    # r = [1, 0, 0.5]: mean 0.5, sample std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    out = ADVANTAGES.get("group_based")([group([1, 0, 0.5])], P)
    s = 0.5 + P.eps
    assert scalars(out) == pytest.approx([0.5 / s, -0.5 / s, 0.0])


def test_scalar_methods_broadcast_to_every_turn():
    out = ADVANTAGES.get("group_based")([group([1, 0], turns=[2, 3])], P)
    a = 0.5 / (math.sqrt(0.5) + P.eps)  # mean 0.5, sample std sqrt(0.5)
    assert out[0][0] == pytest.approx([a, a]) and out[0][1] == pytest.approx([-a, -a, -a])


def test_rloo_leaves_one_out():
    # 1 - mean(0, 0.5) = 0.75; 0 - mean(1, 0.5) = -0.75; 0.5 - mean(1, 0) = 0
    out = ADVANTAGES.get("rloo")([group([1, 0, 0.5])], P)
    assert scalars(out) == pytest.approx([0.75, -0.75, 0.0])


def test_opo_uses_the_length_weighted_baseline():
    # b = (10*1 + 30*0 + 20*0.5) / 60 = 1/3
    out = ADVANTAGES.get("opo")([group([1, 0, 0.5], lengths=[10, 30, 20])], P)
    assert scalars(out) == pytest.approx([2 / 3, -1 / 3, 1 / 6])


def test_grpo_passk_analytic_form():
    params = AdvantageParams(pass_k=2, eps=0.0)
    # n=4, c=1, k=2: rho = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2
    # success: (1 - 1/2) / (1/2) = 1; failure: (1 - 1/2 - C(2,1)/C(3,1)) / (1/2) = -1/3
    out = ADVANTAGES.get("grpo_passk")([group([1, 0, 0, 0])], params)
    assert scalars(out) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # rewards below success_threshold count as failures: 0.7 < 1.0
    out = ADVANTAGES.get("grpo_passk")([group([1, 0.7, 0, 0])], params)
    assert scalars(out) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_grpo_passk_with_k1_is_grpo_on_binary_rewards_with_population_std():
    # mean 1/4, population std sqrt(1/4 * 3/4) = sqrt(3)/4
    out = ADVANTAGES.get("grpo_passk")([group([1, 0, 0, 0])], AdvantageParams(pass_k=1, eps=0.0))
    assert scalars(out) == pytest.approx([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])


def test_reinforce_pp_normalizes_over_the_batch():
    # flat [1, 0, 1, 1]: mean 0.75, sample std sqrt((.0625 + .5625 + .0625 + .0625) / 3) = 0.5
    out = ADVANTAGES.get("reinforce_pp")([group([1, 0]), group([1, 1])], AdvantageParams(eps=0.0))
    assert [t[0] for g in out for t in g] == pytest.approx([0.5, -1.5, 0.5, 0.5])


def test_reinforce_pp_baseline_subtracts_group_mean_then_normalizes_over_batch():
    # centred: [0.5, -0.5] and [-1, -1, 2]; batch mean 0; sample std sqrt(6.5 / 4)
    out = ADVANTAGES.get("reinforce_pp_baseline")([group([1, 0]), group([2, 2, 5])], AdvantageParams(eps=0.0))
    s = math.sqrt(6.5 / 4)
    assert [t[0] for g in out for t in g] == pytest.approx([0.5 / s, -0.5 / s, -1 / s, -1 / s, 2 / s])


def test_gpg_scales_by_the_valid_sample_ratio():
    # B = 4 rollouts, M = 2 in the all-equal group: alpha = 4 / 2 = 2
    out = ADVANTAGES.get("gpg")([group([1, 0]), group([1, 1])], P)
    assert [t[0] for g in out for t in g] == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_monte_carlo_discounted_returns_per_turn():
    # turn rewards [1, 0, 2], gamma 0.5: [1 + 0 + 0.25*2, 0 + 0.5*2, 2] = [1.5, 1, 2]
    g = group([3.0], turns=[3], turn_rewards=((1.0, 0.0, 2.0),))
    assert ADVANTAGES.get("monte_carlo")([g], AdvantageParams(gamma=0.5))[0][0] == pytest.approx([1.5, 1.0, 2.0])
    # a scalar reward sits on the last turn: gamma 1 gives every turn the total
    g = group([3.0], turns=[2])
    assert ADVANTAGES.get("monte_carlo")([g], P)[0][0] == pytest.approx([3.0, 3.0])


def test_group_based_per_turn_with_unequal_turn_counts():
    # A: 3 turns, turn rewards [0, 1, 1] -> returns-to-go [2, 2, 1]
    # B: 1 turn, scalar reward 1          -> [1]
    # C: 2 turns, turn rewards [1] (turn 1 gets 0) -> [1, 0]
    g = group([2, 1, 1], turns=[3, 1, 2], turn_rewards=((0.0, 1.0, 1.0), None, (1.0,)))
    out = ADVANTAGES.get("group_based_per_turn")([g], P)[0]
    # A t0: 2 - mean(B 1, C 1) = 1; t1: 2 - mean(C 0) = 2; t2: nobody else reached it -> 1 - 0 = 1
    assert out[0] == pytest.approx([1.0, 2.0, 1.0])
    # B t0: 1 - mean(A 2, C 1) = -0.5
    assert out[1] == pytest.approx([-0.5])
    # C t0: 1 - mean(A 2, B 1) = -0.5; t1: 0 - mean(A 2) = -2 (B has no turn 1)
    assert out[2] == pytest.approx([-0.5, -2.0])


def test_group_based_per_turn_baseline_ignores_the_rollout_itself():
    base = group([1, 0, 0], turns=[2, 2, 1], turn_rewards=((0.0, 1.0), (0.0, 0.0), (0.0,)))
    more = group([5, 0, 0], turns=[2, 2, 1], turn_rewards=((0.0, 5.0), (0.0, 0.0), (0.0,)))
    a = ADVANTAGES.get("group_based_per_turn")([base], P)[0][0]
    b = ADVANTAGES.get("group_based_per_turn")([more], P)[0][0]
    # rollout 0's return-to-go rose by 4 at both turns, and so did exactly its advantages
    assert [y - x for x, y in zip(a, b)] == pytest.approx([4.0, 4.0])


def test_zero_advantage_groups_are_counted_and_excluded():
    groups = [group([1, 1, 1], gid="same"), group([1, 0, 0, 0], gid="mixed"), group([0.5, 0.2], gid="all-fail")]
    advantages, stats = compute_advantages("group_based", groups)
    assert advantages[0] is None and advantages[1] is not None and advantages[2] is not None
    assert stats["analysis/zero_adv_groups"] == 1.0
    assert stats["analysis/equal_reward_groups"] == 1.0
    # pass@k sees both rewards of "all-fail" below the success threshold: zero advantage, excluded too
    advantages, stats = compute_advantages("grpo_passk", groups, AdvantageParams(pass_k=2))
    assert advantages[1] is not None and advantages[2] is None and stats["analysis/zero_adv_groups"] == 2.0


def test_group_rewards_from_rollouts():
    def t(i, n):
        return Turn("r", i, (), (1,), (2,) * n, (-0.1,) * n, "stop", "")

    rollouts = [
        Rollout("a", "t", "g", RolloutStatus.COMPLETED, turns=(t(0, 3), t(1, 2)), turn_rewards=(0.5, 1.0)),
        Rollout("b", "t", "g", RolloutStatus.COMPLETED, turns=(t(0, 4),), reward=0.25),
    ]
    g = GroupRewards.from_rollouts(rollouts, "g")
    assert g.rewards_G == (1.5, 0.25) and g.num_turns_G == (2, 1) and g.lengths_G == (5, 4)
    assert g.turn_rewards_G == ((0.5, 1.0), None)
    assert g.rewards_per_turn(1) == [0.25]


def test_more_turn_rewards_than_turns_is_an_error():
    with pytest.raises(ValueError, match="rollout 0 has 3 turn rewards for 2 turns"):
        group([1.0], turns=[2], turn_rewards=((1.0, 0.0, 0.0),))


def test_unknown_method_lists_known_names():
    with pytest.raises(KeyError, match="unknown advantage method 'grpo'.*group_based"):
        compute_advantages("grpo", [group([1, 0])])
