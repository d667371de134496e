"""Offline what-if: a run's stored rollouts under another reward (and advantage method), nothing generated.

``mtrl rescore RUN --reward module:fn`` reads the run folder's store
read-only (``load_run``), rebuilds each step's batch as the update saw it,
scores every completed rollout with the reward function (one signature:
``fn(trajectory: mtrl_runtime.rewards.Trajectory) -> float | (float,
{metric: value})``), and recomputes advantages and the per-token signal
with the trainer's own batch preparation, side by side with what the run
used (``rescore_run``); the original side is checked against the run's
logged metrics. ``report_data`` / ``write_report`` write the report
(Markdown, JSON, PNG), by default into ``RUN/rescore-<name>/``.
"""

from ._report import plot_report, render_markdown, report_data, write_report
from ._rescore import (
    REPRODUCED,
    Mismatch,
    RescoreError,
    RescoreResult,
    RewardChange,
    StepComparison,
    off_policy_bound,
    rescore_run,
    score_rollouts,
)
from ._run import StoredRun, StoredStep, load_run, open_run_store, run_config
from ._signal import StepSignal, reward_distribution, step_signal, with_rewards

__all__ = [
    "REPRODUCED",
    "Mismatch",
    "RescoreError",
    "RescoreResult",
    "RewardChange",
    "StepComparison",
    "StepSignal",
    "StoredRun",
    "StoredStep",
    "load_run",
    "off_policy_bound",
    "open_run_store",
    "plot_report",
    "render_markdown",
    "report_data",
    "rescore_run",
    "reward_distribution",
    "run_config",
    "score_rollouts",
    "step_signal",
    "with_rewards",
    "write_report",
]
