"""Sequence extension: the token mask of extended multi-turn sequences, breaks, and the stats."""

import pytest

from mtrl_runtime.algorithms import PrefixError, SampleStats, build_samples, per_turn_samples
from mtrl_runtime.types import BreakReason, Rollout, RolloutStatus, Turn

SYSTEM = (1, 2, 3)  # system prompt + template
USER = (10, 11)  # user message + glue before the first reply
TOOL_1 = (12, 13)  # tool result + glue after reply 0
TOOL_2 = (14,)  # tool result + glue after reply 1
REPLY_0, REPLY_1, REPLY_2 = (20, 21, 22), (23, 24), (25,)
LOGP_0, LOGP_1, LOGP_2 = (-0.1, -0.2, -0.3), (-0.4, -0.5), (-0.6,)


def turn(index, prompt, completion, logprobs, segment=0, version=0, break_reason=None):
    return Turn(
        rollout_id="r1", index=index, messages=(), prompt_ids=tuple(prompt),
        completion_ids=tuple(completion), logprobs=tuple(logprobs), finish_reason="stop",
        completion_text="", policy_version=version, segment=segment, break_reason=break_reason,
    )


def rollout(*turns):
    return Rollout(id="r1", task_id="t1", group_id="g1", status=RolloutStatus.COMPLETED, turns=turns, reward=1.0)


def extended_rollout():
    p0 = SYSTEM + USER
    p1 = p0 + REPLY_0 + TOOL_1
    p2 = p1 + REPLY_1 + TOOL_2
    return rollout(
        turn(0, p0, REPLY_0, LOGP_0, version=3),
        turn(1, p1, REPLY_1, LOGP_1, version=3),
        turn(2, p2, REPLY_2, LOGP_2, version=4),
    )


def test_extended_rollout_is_one_sequence_with_mask_on_replies_only():
    [sample] = build_samples(extended_rollout(), [0.5, -1.0, 2.0])
    # by hand: sys(3) user(2) reply0(3) tool1(2) reply1(2) tool2(1) reply2(1) = 14 tokens
    assert sample.token_ids_T == (1, 2, 3, 10, 11, 20, 21, 22, 12, 13, 23, 24, 14, 25)
    assert sample.loss_mask_T == (0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1)
    assert sample.behaviour_logprobs_T == (
        0.0, 0.0, 0.0, 0.0, 0.0, -0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5, 0.0, -0.6,
    )
    assert sample.advantages_T == (0, 0, 0, 0, 0, 0.5, 0.5, 0.5, 0, 0, -1.0, -1.0, 0, 2.0)
    assert sample.policy_version_T == (-1, -1, -1, -1, -1, 3, 3, 3, -1, -1, 3, 3, -1, 4)
    assert (sample.rollout_id, sample.group_id, sample.segment) == ("r1", "g1", 0)


def test_a_break_gives_two_segments():
    p0 = SYSTEM + USER
    p1 = p0 + REPLY_0 + TOOL_1
    p2 = SYSTEM + (15, 16)  # history rewritten: a new prompt that does not extend turn 1
    broken = rollout(
        turn(0, p0, REPLY_0, LOGP_0),
        turn(1, p1, REPLY_1, LOGP_1),
        turn(2, p2, REPLY_2, LOGP_2, segment=1, break_reason=BreakReason.HISTORY_REWRITTEN),
    )
    first, second = build_samples(broken, [1.0, 2.0, 3.0])
    assert first.segment == 0 and second.segment == 1
    assert first.token_ids_T == p1 + REPLY_1
    assert first.loss_mask_T == (0,) * 5 + (1, 1, 1) + (0, 0) + (1, 1)
    assert first.advantages_T[5:8] == (1.0, 1.0, 1.0) and first.advantages_T[10:] == (2.0, 2.0)
    assert second.token_ids_T == (1, 2, 3, 15, 16, 25)
    assert second.loss_mask_T == (0, 0, 0, 0, 0, 1)
    assert second.advantages_T == (0, 0, 0, 0, 0, 3.0)

    stats = SampleStats.from_rollouts([broken, extended_rollout()])
    assert (stats.rollouts, stats.turns, stats.segments) == (2, 6, 3)
    # merged: turns 0-1 of the broken rollout and all 3 of the other; turn 2 stands alone
    assert stats.merge_ratio == pytest.approx(5 / 6)
    # 4 turns had a predecessor, 3 of them extended it
    assert stats.extension_rate == pytest.approx(3 / 4)
    assert stats.break_reasons == {"history_rewritten": 1}
    assert stats.to_metrics()["samples/breaks/history_rewritten"] == 1.0


def test_prefix_violation_raises_naming_the_turn():
    p0 = SYSTEM + USER
    p1 = SYSTEM + (99,) + REPLY_0 + TOOL_1  # claims to extend turn 0 but differs at token 3
    bad = rollout(turn(0, p0, REPLY_0, LOGP_0), turn(1, p1, REPLY_1, LOGP_1))
    with pytest.raises(PrefixError, match=r"turn 0 .*first difference at token 3"):
        build_samples(bad, [1.0, 1.0])


def test_per_turn_samples_repeat_the_prefix():
    samples = per_turn_samples(extended_rollout(), [0.5, -1.0, 2.0])
    assert [len(s.token_ids_T) for s in samples] == [8, 12, 14]
    assert [sum(s.loss_mask_T) for s in samples] == [3, 2, 1]
    assert samples[1].advantages_T[-2:] == (-1.0, -1.0)
    assert samples[1].behaviour_logprobs_T[-2:] == LOGP_1
    # 34 tokens through the model instead of 14
    assert sum(len(s.token_ids_T) for s in samples) == 34


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="advantages_per_turn has 2 values for 3 turns"):
        build_samples(extended_rollout(), [1.0, 2.0])
    short = rollout(turn(0, SYSTEM, REPLY_0, (-0.1,)))
    with pytest.raises(ValueError, match="1 logprobs for 3 completion_ids"):
        build_samples(short, [1.0])
