"""Collecting rollouts: everything training, evaluation, the checks and serving share.

- ``RolloutStack`` / ``open_stack``: the one composition of engine, store,
  coordinator, loopback server and executor; ``store_for``: the store a run
  records into (the backend ``core.store`` names);
- ``executor_for``: which executor runs the agent, from what the user passed;
- ``Dispatcher``: ``group_size`` rollouts per task under one concurrency
  limit and one deadline per rollout, groups formed by a group policy
  (``GROUP_POLICIES``, re-exported from ``mtrl_runtime.group_policies``);
- ``collect_rollouts``: an agent over N tasks without training (``mtrl collect``);
- ``run_to_stop``: ``asyncio.run`` for a blocking run, whose stop by hand a second
  Ctrl-C does not cut short; ``sigterm_as_ctrl_c``, the CLI's SIGTERM handler,
  which such a run answers as Ctrl-C even where Ctrl-C is ignored;
- ``load_tasks`` / ``TaskSchedule``: tasks from a dataset (``task_sources``:
  JSONL, JSON, CSV, parquet, Arrow, ``datasets``), and the seeded order
  training draws them in.

Training and evaluation both sit above this floor; it imports neither.
"""

from ..group_policies import GROUP_POLICIES, GroupDecision, GroupPolicy, GroupRound
from ._collect import COLLECT_RUNS_KEY, Collected, collect_rollouts, rollout_line
from ._dispatcher import ENVIRONMENT_PROBLEM_RATE, Dispatcher, GroupResult, StepBatch, group_id_for, refill_group_id
from ._executors import EXECUTOR_KINDS, ExecutorKind, ExecutorOptions, executor_for, executor_kind
from ._heartbeat import HEARTBEAT_S, Heartbeat, RolloutTally
from ._stack import RolloutStack, open_stack, store_for
from ._stop import run_to_stop, sigterm_as_ctrl_c
from ._tasks import TaskSchedule, load_tasks, task_from_row

__all__ = [
    "COLLECT_RUNS_KEY",
    "Collected",
    "ENVIRONMENT_PROBLEM_RATE",
    "EXECUTOR_KINDS",
    "GROUP_POLICIES",
    "HEARTBEAT_S",
    "Dispatcher",
    "ExecutorKind",
    "ExecutorOptions",
    "GroupDecision",
    "GroupPolicy",
    "GroupResult",
    "GroupRound",
    "Heartbeat",
    "RolloutStack",
    "RolloutTally",
    "StepBatch",
    "TaskSchedule",
    "collect_rollouts",
    "executor_for",
    "executor_kind",
    "group_id_for",
    "load_tasks",
    "open_stack",
    "refill_group_id",
    "rollout_line",
    "run_to_stop",
    "sigterm_as_ctrl_c",
    "store_for",
    "task_from_row",
]
