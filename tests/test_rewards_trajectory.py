"""The one signature reward functions outside the agent read a stored rollout through."""

from __future__ import annotations

import math

import pytest

from mtrl_runtime.rewards import Trajectory, score_trajectory, trajectory_of
from mtrl_runtime.types import Rollout, RolloutStatus, Task, ToolCall, Turn


def _rollout() -> tuple[Rollout, Task]:
    task = Task(id="t1", prompt="add 2 and 3", ground_truth="5")
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    first = Turn("r1", 0, ({"role": "user", "content": "add 2 and 3"},), (1, 2), (3, 4), (-0.1, -0.2), "tool_calls",
                 "", tool_calls=(call,))
    second = Turn("r1", 1, ({"role": "user", "content": "add 2 and 3"},
                            {"role": "assistant", "content": "", "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": "c1", "content": "5"}),
                  (1, 2, 3, 4, 5), (6, 7, 8), (-0.3, -0.1, -0.2), "stop", "The sum is 5")
    tool = ToolCall("r1", "add", {"a": 2, "b": 3}, call_id="c1", result=5, started_at=1.0)
    rollout = Rollout("r1", "t1", "g0", RolloutStatus.COMPLETED, turns=(second, first), tool_calls=(tool,),
                      reward=0.5, metrics={"format": 1.0})
    return rollout, task


def test_trajectory_holds_the_conversation_the_calls_and_the_final_answer() -> None:
    rollout, task = _rollout()
    traj = trajectory_of(rollout, task)
    assert traj.final_answer == "The sum is 5"
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool", "assistant"]
    assert traj.messages[-1]["content"] == "The sum is 5"
    assert traj.tool_calls[0].name == "add" and traj.tool_calls[0].result == 5
    assert traj.completion_tokens == 5 and traj.reward == 0.5 and traj.ground_truth == "5"
    assert traj.metrics == {"format": 1.0}


def test_a_rollout_of_another_task_is_refused() -> None:
    rollout, _ = _rollout()
    with pytest.raises(ValueError, match="'t1', not 'other'"):
        trajectory_of(rollout, Task(id="other", prompt="x"))


def test_score_trajectory_reads_numbers_and_pairs_and_names_bad_values() -> None:
    rollout, task = _rollout()
    traj = trajectory_of(rollout, task)

    def exact(t: Trajectory) -> float:
        return float(t.final_answer.endswith(str(t.ground_truth)))

    assert score_trajectory(exact, traj) == (1.0, {})
    assert score_trajectory(lambda t: (True, {"len": 3}), traj) == (1.0, {"len": 3.0})
    with pytest.raises(ValueError, match=r"my_reward returned nan for rollout 'r1'"):
        score_trajectory(lambda t: math.nan, traj, name="my_reward")
    with pytest.raises(ValueError, match=r"metric 'x' = 'high'"):
        score_trajectory(lambda t: (1.0, {"x": "high"}), traj)
    with pytest.raises(ValueError, match="expected a number or"):
        score_trajectory(lambda t: (1.0, 2.0, 3.0), traj)
