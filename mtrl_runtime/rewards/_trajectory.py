"""``Trajectory``: what a reward function outside the agent reads of one stored rollout."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Union

from ..types import JSON, Rollout, Task, ToolCall

RewardValue = Union[float, int, bool, tuple]  # a number, or (number, {metric: value})
RewardFn = Callable[["Trajectory"], RewardValue]


@dataclass(frozen=True)
class Trajectory:
    """One rollout as a reward function sees it.

    ``messages``: the conversation as the model last saw it, then its final
    reply (OpenAI chat format, tool calls included). ``tool_calls``: every
    tool call the adapters recorded, results and errors included.
    ``final_answer``: the text of the model's last reply ("" when it never
    answered). ``reward``: what the run recorded (None when it had none).
    """

    task: Task
    rollout_id: str
    group_id: str
    messages: tuple[Mapping[str, JSON], ...]
    tool_calls: tuple[ToolCall, ...]
    final_answer: str
    status: str
    completion_tokens: int
    reward: float | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def ground_truth(self) -> JSON:
        return self.task.ground_truth


def trajectory_of(rollout: Rollout, task: Task) -> Trajectory:
    """The ``Trajectory`` of a stored rollout (read with its turns) of ``task``."""
    if rollout.task_id != task.id:
        raise ValueError(f"trajectory_of: rollout {rollout.id!r} is of task {rollout.task_id!r}, not {task.id!r}")
    turns = sorted(rollout.turns, key=lambda t: t.index)
    messages = last_conversation(rollout)
    reward = None if rollout.reward is None and rollout.turn_rewards is None else rollout.total_reward
    return Trajectory(
        task=task,
        rollout_id=rollout.id,
        group_id=rollout.group_id,
        messages=tuple(messages),
        tool_calls=tuple(sorted(rollout.tool_calls, key=lambda c: c.started_at)),
        final_answer=turns[-1].completion_text if turns else "",
        status=rollout.status.value,
        completion_tokens=sum(len(t.completion_ids) for t in turns),
        reward=reward,
        metrics=dict(rollout.metrics),
    )


def last_conversation(rollout: Rollout) -> list[dict[str, Any]]:
    """The messages the model last saw, then its last reply (with its tool calls); [] when it never answered."""
    turns = sorted(rollout.turns, key=lambda t: t.index)
    if not turns:
        return []
    last = turns[-1]
    reply: dict[str, Any] = {"role": "assistant", "content": last.completion_text}
    if last.tool_calls:
        reply["tool_calls"] = [dict(c) for c in last.tool_calls]
    return [*(dict(m) for m in last.messages), reply]


def score_trajectory(fn: RewardFn, trajectory: Trajectory, name: str = "reward") -> tuple[float, dict[str, float]]:
    """Call ``fn(trajectory)``; its score and metrics, or a ValueError naming the function, rollout and value."""
    value = fn(trajectory)
    metrics: Mapping[str, Any] = {}
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], Mapping):
            raise ValueError(f"{name} returned {value!r} for rollout {trajectory.rollout_id!r}; "
                             "expected a number or (number, {metric: value})")
        value, metrics = value
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} returned {value!r} for rollout {trajectory.rollout_id!r}; expected a finite number")
    out = {}
    for key, metric in metrics.items():
        if isinstance(metric, bool) or not isinstance(metric, (int, float)) or not math.isfinite(metric):
            raise ValueError(f"{name} returned metric {key!r} = {metric!r} for rollout "
                             f"{trajectory.rollout_id!r}; expected a finite number")
        out[str(key)] = float(metric)
    return float(value), out
