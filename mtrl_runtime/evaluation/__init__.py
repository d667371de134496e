"""Evaluation: pass@k and the summary metrics of evaluation rollouts."""

from ._metrics import (
    PASS_K_PREFIX,
    EvalRecord,
    completion_rate,
    eval_metrics,
    mean_reward,
    mean_turns,
    pass_at_k,
    pass_k_metrics,
    reward_metric_means,
    success_rate,
    successes_by_task,
    token_cap_fraction,
    tool_call_distribution,
    turn_limit_rate,
)

__all__ = [
    "PASS_K_PREFIX",
    "EvalRecord",
    "completion_rate",
    "eval_metrics",
    "mean_reward",
    "mean_turns",
    "pass_at_k",
    "pass_k_metrics",
    "reward_metric_means",
    "success_rate",
    "successes_by_task",
    "token_cap_fraction",
    "tool_call_distribution",
    "turn_limit_rate",
]
