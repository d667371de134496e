"""pass@k against hand-computed values, and the evaluation summary metrics."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from mtrl_runtime.evaluation import (
    EvalRecord,
    completion_rate,
    eval_metrics,
    pass_at_k,
    pass_k_metrics,
    reward_metric_means,
    successes_by_task,
    token_cap_fraction,
    tool_call_distribution,
    turn_limit_rate,
)
from mtrl_runtime.types import RolloutStatus


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 1 - 3 / 5),  # 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5) = 1 - 21/252 = 11/12
    (8, 1, 4, 1 - 35 / 70),  # 1 - C(7,4)/C(8,4) = 1 - 35/70 = 0.5
    (4, 0, 2, 0.0),  # no success: 1 - C(4,2)/C(4,2) = 0
    (4, 3, 2, 1.0),  # n - c = 1 < k = 2: every pair holds a success
    (4, 4, 1, 1.0),
    (4, 1, 4, 1.0),  # k = n: the one success is always drawn
    (1000, 1, 1, 1 / 1000),  # pass@1 is the success rate c/n
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_binomial_definition_and_stays_stable_at_large_n():
    for n in range(1, 16):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)
    # C(2000, 1000) has ~600 digits and overflows a float; the product form never builds it.
    exact = 1 - Fraction(math.comb(1900, 1000), math.comb(2000, 1000))
    assert pass_at_k(2000, 100, 1000) == pytest.approx(float(exact), abs=1e-12)
    assert 0.0 <= pass_at_k(2000, 1, 1) < pass_at_k(2000, 1, 2) < pass_at_k(2000, 1, 1999) <= 1.0


@pytest.mark.parametrize("n, c, k, message", [
    (4, 1, 8, "undefined for k > n"),
    (4, 5, 1, "c must be in"),
    (4, -1, 1, "c must be in"),
    (0, 0, 1, "n must be >= 1"),
    (4, 1, 0, "k must be in"),
    (4, True, 1, "c must be an int"),
    (4.0, 1, 1, "n must be an int"),
])
def test_pass_at_k_rejects_bad_input(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def test_pass_k_metrics_averages_tasks_and_skips_k_above_the_smallest_n():
    tasks = [
        [True, False, False, False],  # n=4, c=1: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2, pass@4 = 1
        [False, False, False, False],  # c=0: 0 for every k
        [True, True, True, True],  # c=n: 1 for every k
    ]
    metrics = pass_k_metrics(tasks, [8, 1, 2, 4, 2])
    assert list(metrics) == ["val/reward/pass_k_1", "val/reward/pass_k_2", "val/reward/pass_k_4"]  # k=8 > n=4: left out
    assert metrics["val/reward/pass_k_1"] == pytest.approx((1 / 4 + 0 + 1) / 3)
    assert metrics["val/reward/pass_k_2"] == pytest.approx((1 / 2 + 0 + 1) / 3)
    assert metrics["val/reward/pass_k_4"] == pytest.approx((1 + 0 + 1) / 3)
    # One task with only 2 samples limits every task to k <= 2.
    assert list(pass_k_metrics(tasks + [[True, False]], [1, 2, 4])) == ["val/reward/pass_k_1", "val/reward/pass_k_2"]


def test_pass_k_metrics_rejects_bad_input():
    with pytest.raises(ValueError, match="successes_per_task is empty"):
        pass_k_metrics([], [1])
    with pytest.raises(ValueError, match="task 1 has no samples"):
        pass_k_metrics([[True], []], [1])
    with pytest.raises(ValueError, match="task 0 has a non-bool outcome 1"):
        pass_k_metrics([[1, 0]], [1])
    with pytest.raises(ValueError, match="every k must be >= 1, got 0"):
        pass_k_metrics([[True]], [0])


def records() -> list[EvalRecord]:
    return [
        EvalRecord("t1", 1.0, True, "completed", turns=3, responses=3, tool_calls=["search", "book"],
                   metrics={"field_acc": 1.0, "completion": 1.0}, reasoning_tokens=30, completion_tokens=100),
        EvalRecord("t1", 0.5, False, "completed", turns=8, hit_turn_limit=True, hit_token_cap_count=2, responses=8,
                   tool_calls=["search", "search", "search"], metrics={"field_acc": 0.5}),
        EvalRecord("t2", 0.0, False, RolloutStatus.FAILED, turns=1, responses=1, metrics={"field_acc": 0.0},
                   reasoning_tokens=10, completion_tokens=60),
        EvalRecord("t2", 1.0, True, "timed_out", turns=4, hit_token_cap_count=1, responses=4, tool_calls=["book"]),
    ]


def test_summary_metrics_from_records():
    recs = records()
    assert successes_by_task(recs) == {"t1": [True, False], "t2": [False, True]}
    assert completion_rate(recs) == 2 / 4
    assert turn_limit_rate(recs) == 1 / 4
    assert token_cap_fraction(recs) == (0 + 2 + 0 + 1) / (3 + 8 + 1 + 4)  # 3 of 16 responses
    assert tool_call_distribution(recs) == {"book": 2 / 6, "search": 4 / 6}
    assert reward_metric_means(recs) == {"completion": 1.0, "field_acc": (1.0 + 0.5 + 0.0) / 3}
    assert recs[2].status == "failed" and recs[0].tool_calls == ("search", "book")


def test_eval_metrics_names_and_values():
    metrics = eval_metrics(records(), [1, 2, 4], prefix="val")
    assert metrics == pytest.approx({
        "val/reward/mean": (1.0 + 0.5 + 0.0 + 1.0) / 4,
        "val/reward/success_rate": 2 / 4,
        "val/reward/pass_k_1": (1 / 2 + 1 / 2) / 2,  # each task: n=2, c=1 -> pass@1 = 1/2
        "val/reward/pass_k_2": 1.0,  # n=2, c=1, k=2: n - c = 1 < 2 -> 1
        "val/completed_frac": 0.5,
        "val/turn_limit_frac": 0.25,
        "val/truncated_frac": 3 / 16,
        "val/turns/mean": (3 + 8 + 1 + 4) / 4,
        "val/tool_calls/mean": (2 + 3 + 0 + 1) / 4,
        "val/tokens/reasoning_mean": (30 + 0 + 10 + 0) / 4,
        "val/tokens/reasoning_frac": (30 + 10) / (100 + 60),
        "val/tool_calls/book_frac": 2 / 6,
        "val/tool_calls/search_frac": 4 / 6,
        "val/metrics/completion": 1.0,
        "val/metrics/field_acc": 0.5,
    })
    with pytest.raises(ValueError, match="no evaluation records"):
        eval_metrics([], [1])


def test_eval_record_validates_its_fields():
    with pytest.raises(ValueError, match="hit_token_cap_count must be in \\[0, responses=2\\], got 3"):
        EvalRecord("t", 1.0, True, hit_token_cap_count=3, responses=2)
    with pytest.raises(ValueError, match="reward must be finite"):
        EvalRecord("t", float("nan"), False)
    with pytest.raises(ValueError, match="turns and responses must be >= 0"):
        EvalRecord("t", 0.0, False, turns=-1)
    with pytest.raises(ValueError, match="reasoning_tokens and completion_tokens must be >= 0, got -1, 0"):
        EvalRecord("t", 0.0, False, reasoning_tokens=-1)
