"""Which executor runs the agent is chosen from what the user passed, by a registry of kinds."""

from __future__ import annotations

import pytest

from mtrl_runtime.evaluation import MultiTurnRLEvaluator
from mtrl_runtime.executors import HttpExecutor, InProcessExecutor
from mtrl_runtime.rollouts import EXECUTOR_KINDS, executor_for, executor_kind
from mtrl_runtime.training import MultiTurnRLTrainer
from mtrl_runtime.types import RolloutOutcome, RolloutSpec, RolloutStatus


class _OwnExecutor:
    async def run(self, spec: RolloutSpec) -> RolloutOutcome:
        return RolloutOutcome(spec.rollout_id, RolloutStatus.COMPLETED)

    async def close(self) -> None:
        pass


def _agent(task):
    return task.prompt


async def test_each_kind_of_agent_env_gets_its_executor():
    own = _OwnExecutor()
    assert [k.name for k in EXECUTOR_KINDS] == ["executor", "agentcore", "url", "function"]
    assert executor_for(own, 4) is own
    remote = executor_for("http://127.0.0.1:9/", 4)
    assert isinstance(remote, HttpExecutor) and remote.url == "http://127.0.0.1:9"
    await remote.close()
    local = executor_for(_agent, 7)
    assert isinstance(local, InProcessExecutor) and local.max_threads == 7


@pytest.mark.parametrize("bad", [42, None, ["not", "an", "agent"]])
def test_anything_else_is_refused_naming_the_value_and_the_kinds(bad):
    with pytest.raises(TypeError, match=r"agent_env: expected a function, a RolloutExecutor, an AgentCore Runtime ARN or a URL "
                       r"\(executor, agentcore, url, function\), got"):
        executor_kind(bad)


def test_the_trainer_and_the_evaluator_refuse_a_wrong_agent_env_when_constructed(tmp_path):
    rows = [{"id": "t", "prompt": "q"}]
    with pytest.raises(TypeError, match="agent_env: expected a function.*got 42"):
        MultiTurnRLTrainer(model="m", agent_env=42, training_dataset=rows, output_path=tmp_path)
    with pytest.raises(TypeError, match="agent_env: expected a function.*got 42"):
        MultiTurnRLEvaluator(model="m", agent_env=42, dataset=rows, output_path=tmp_path)
