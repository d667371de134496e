"""A judge inside the rollout with ``policy_models`` unset (the default): never trained, never silent.

Agents written as their frameworks' docs teach (a Strands ``OpenAIModel`` and
LangChain v1 ``create_agent`` over ``ChatAnthropic``, each with its vendor's
endpoint and a placeholder key), whose reward asks a judge: an
``openai.AsyncOpenAI(base_url=JUDGE_URL)`` client naming another model. 20
rollouts (10 tasks, ``group_size`` 2) run through ``collect_rollouts`` (the
dispatcher and in-process executor training uses) on the scripted policy.
With nothing named, mtrl cannot tell the judge's client from the policy's:
the judge's call is refused before it is sent and the rollout fails, flagged,
naming ``advanced.policy_models`` (even when the agent catches the error).
When the policy's client is aimed at the coordinator (``OPENAI_BASE_URL``),
the judge's call passes through to the judge with its own key, recorded, the
rollout flagged. Before this rule every judge call went to the policy (the
judge endpoint got none of the 20) and nothing was flagged: the agent that
scores a failed judge 0 completed all 20 rollouts that way.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from _adapter_support import OFFSET, add, key_of, lookup, per_turn_rewards, policy, value_of
from _judge_upstream import USAGE, judge_upstream
from mtrl_adapters import AmbiguousModelCalls, UnresolvedModelCall, aupdate_reward, rollout
from mtrl_adapters._policy_rule import AMBIGUOUS_FLAG, INFERRED_FLAG, UnnamedPolicy, call_kind
from mtrl_adapters.wire import AgentFlag
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.rollouts import collect_rollouts, rollout_line
from mtrl_runtime.testing import free_port
from mtrl_runtime.training import rollout_metrics
from mtrl_runtime.types import ROLLOUT_FLAGS, RolloutStatus, Task

JUDGE_MODEL = "judge-gpt"
JUDGE_KEY = "sk-judge-user-key"
KEYS = (0, 1, 2, 4, 6, 7, 8, 9, 10, 11)  # ten tasks (no K03: its tool fails; no K05: the crash case)


def _tasks() -> list[Task]:
    return [Task(id=f"t{k:02d}", prompt=f"What is the value of key K{k:02d} plus {OFFSET}?") for k in KEYS]


def _config(tmp_path: Any, port: int = 0) -> MtrlConfig:
    return MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run"), "group_size": 2, "max_turns": 6},
                                 "advanced": {"rollout_timeout_s": 120, "server": {"port": port}}})


def _judge(url: str) -> Any:
    import openai

    return openai.AsyncOpenAI(api_key=JUDGE_KEY, base_url=url, max_retries=0)


async def _grade(judge: Any, answer: str) -> float:
    verdict = await judge.chat.completions.create(
        model=JUDGE_MODEL, messages=[{"role": "user", "content": f"Grade this answer: {answer}"}])
    return 1.0 if verdict.choices[0].message.content == "SCORE 1" else 0.0


def _strands_agent(judge_url: str, client_args: dict[str, Any], *, lenient: bool = False) -> Any:
    """A Strands agent as its docs write one (an ``OpenAIModel``, two tools), judged by another model.

    ``lenient``: the reward code catches a failed judge call and scores 0 (a common way to write it)."""
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    from mtrl_adapters.strands import MtrlHooks

    model = OpenAIModel(client_args=client_args, model_id="gpt-4o-mini")
    judge = _judge(judge_url)

    @rollout
    async def run(task: Any) -> str:
        agent = Agent(model=model, tools=[tool(lookup), tool(add)], callback_handler=None, hooks=[MtrlHooks()])
        answer = str(await agent.invoke_async(task.prompt))
        try:
            score = await _grade(judge, answer)
        except Exception:
            if not lenient:
                raise
            score = 0.0
        turns = sum(1 for m in agent.messages if m["role"] == "assistant")
        await aupdate_reward([r * score for r in per_turn_rewards(turns)])
        return answer

    return run


def _langchain_anthropic_agent(judge_url: str) -> Any:
    """LangChain v1 ``create_agent`` over ``ChatAnthropic`` (Anthropic's endpoint, a placeholder key), judged."""
    from langchain.agents import create_agent
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool

    import mtrl_adapters.langgraph  # noqa: F401  (the LangChain tool-call callbacks)

    llm = ChatAnthropic(model="claude-sonnet-4-5", api_key="sk-ant-user-real-key", max_retries=0, max_tokens=256)
    graph = create_agent(llm, tools=[tool(lookup), tool(add)], system_prompt="Use the tools.")
    judge = _judge(judge_url)

    @rollout
    async def run(task: Any) -> str:
        state = await graph.ainvoke({"messages": [{"role": "user", "content": task.prompt}]})
        answer = state["messages"][-1].text
        await aupdate_reward(await _grade(judge, answer))
        return answer

    return run


AGENTS = {
    "strands-openai": lambda url: _strands_agent(url, {"api_key": "sk-user-real-key"}),
    "strands-openai-lenient": lambda url: _strands_agent(url, {"api_key": "sk-user-real-key"}, lenient=True),
    "langchain-chat-anthropic": _langchain_anthropic_agent,
}


@pytest.mark.parametrize("name", sorted(AGENTS))
async def test_a_judge_with_policy_models_unset_is_refused_and_flagged_never_trained(name, tiny_tok, tmp_path):
    if name.startswith("langchain"):
        pytest.importorskip("langchain_anthropic")
    pytest.importorskip("strands")
    with judge_upstream() as judge:
        agent = AGENTS[name](judge.url)
        collected = await collect_rollouts(_config(tmp_path), agent, _tasks(),
                                           engine=ScriptedEngine(tiny_tok, policy))
        assert judge.calls == []  # nothing reached the judge through the policy's hands, nothing untrained
    rollouts = collected.rollouts
    assert len(rollouts) == 20
    for stored in rollouts:
        assert stored.status is RolloutStatus.FAILED, (stored.status, stored.error)
        assert "advanced.policy_models" in stored.error and JUDGE_MODEL in stored.error
        assert stored.metrics[AMBIGUOUS_FLAG] == 1.0 and AMBIGUOUS_FLAG in stored.flags
        assert all("Grade this answer" not in json.dumps(list(t.messages)) for t in stored.turns)  # never a turn
        assert len(stored.turns) == 3  # the policy's own turns, recorded (on a failed rollout: never trained)
        line = rollout_line(Task(id=stored.task_id, prompt=""), stored)
        assert f"{AMBIGUOUS_FLAG}=1" in line.partition("flags: ")[2] and "policy_models" in line
    metrics = rollout_metrics(rollouts)
    assert metrics[f"rollout/flagged/{AMBIGUOUS_FLAG}"] == 20.0
    assert metrics[f"rollout/flagged/{INFERRED_FLAG}"] == 0.0


async def test_a_judge_beside_a_policy_aimed_at_the_coordinator_passes_through_flagged(tiny_tok, tmp_path, monkeypatch):
    """The policy's client reads ``OPENAI_BASE_URL`` (the coordinator's address): the judge's call, from a client
    aimed elsewhere, reaches the judge with the user's key and is recorded as a non-policy call."""
    pytest.importorskip("strands")
    port = free_port()
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    with judge_upstream() as judge:
        agent = _strands_agent(judge.url, {"api_key": "unused"})
        collected = await collect_rollouts(_config(tmp_path, port), agent, _tasks(),
                                           engine=ScriptedEngine(tiny_tok, policy))
        calls = list(judge.calls)
    assert len(calls) == 20
    for call in calls:
        assert call["headers"]["Authorization"] == f"Bearer {JUDGE_KEY}" and call["body"]["model"] == JUDGE_MODEL
        assert "x-mtrl-rollout-id" not in call["headers"]
    for stored in collected.rollouts:
        assert stored.status is RolloutStatus.COMPLETED, stored.error
        assert stored.turn_rewards == (0.0, 0.0, 1.0)  # the judge's verdict reached the reward
        assert all("Grade this answer" not in json.dumps(list(t.messages)) for t in stored.turns)
        key = key_of(stored.turns[0].messages[0]["content"])
        assert f"is {value_of(key) + OFFSET}" in stored.turns[-1].completion_text
        [passed] = stored.model_calls
        assert (passed.model, passed.protocol, (passed.input_tokens, passed.output_tokens)) == (
            JUDGE_MODEL, "openai", USAGE)
        assert stored.metrics[INFERRED_FLAG] == 1.0 and stored.flags == (INFERRED_FLAG,)
        assert f"flags: {INFERRED_FLAG}=1" in rollout_line(Task(id=stored.task_id, prompt=""), stored)
    assert rollout_metrics(collected.rollouts)[f"rollout/flagged/{INFERRED_FLAG}"] == 20.0


# ---------------------------------------------------------------------- the rule alone
ENDPOINT = "http://127.0.0.1:8731"


def _kind(model: str, base_url: str, protocol: str = "openai") -> Any:
    return call_kind(protocol, model, base_url, ENDPOINT)


def test_calls_alike_are_the_policys_whatever_their_endpoint():
    rule = UnnamedPolicy()
    for _ in range(3):
        assert rule.is_policy(_kind("gpt-4o-mini", "https://api.openai.com/v1/"), "r")
    assert rule.is_policy(_kind("gpt-4o-mini", "https://api.openai.com/v1"), "r")  # a trailing slash is no difference
    assert rule.flags() == {} and rule.refusal is None


@pytest.mark.parametrize("first, then", [
    (("gpt-4o-mini", "https://api.openai.com/v1"), ("judge-gpt", "http://judge.internal/v1")),  # both elsewhere
    (("gpt-4o-mini", "https://api.openai.com/v1"), ("gpt-4.1", "https://api.openai.com/v1")),  # one endpoint, 2 models
    (("policy", "http://vllm.internal:8000/v1"), ("gpt-4.1", "https://api.openai.com/v1")),  # own server, judge default
    (("judge-gpt", "http://judge.internal/v1"), ("policy", f"{ENDPOINT}/v1")),  # judge first, then the coordinator's
])
def test_calls_unlike_each_other_are_refused_naming_policy_models(first, then):
    rule = UnnamedPolicy()
    assert rule.is_policy(_kind(*first), "r-1")
    with pytest.raises(AmbiguousModelCalls, match=r"advanced\.policy_models") as refused:
        rule.is_policy(_kind(*then), "r-1")
    assert isinstance(refused.value, UnresolvedModelCall) and then[0] in str(refused.value)
    assert rule.refusal == str(refused.value) and rule.flags() == {AMBIGUOUS_FLAG: 1.0}


def test_a_client_aimed_at_the_coordinator_makes_every_other_call_pass_through():
    rule = UnnamedPolicy()
    assert rule.is_policy(_kind("policy", f"{ENDPOINT}/rollouts/r-1/v1"), "r-1")  # model_endpoint
    assert rule.is_policy(_kind("other-name", f"{ENDPOINT}/v1"), "r-1")  # still the coordinator: the policy
    assert not rule.is_policy(_kind("judge-gpt", "http://judge.internal/v1"), "r-1")
    assert not rule.is_policy(_kind("converse-judge", "https://bedrock-runtime.us-east-1.amazonaws.com", "bedrock"), "r-1")
    assert not rule.is_policy(_kind("policy", "http://127.0.0.1:9999/v1"), "r-1")  # another port is elsewhere
    assert rule.flags() == {INFERRED_FLAG: 3.0} and rule.refusal is None


def test_the_agent_side_flags_are_the_wires_and_the_runs():
    from typing import get_args

    assert set(get_args(AgentFlag)) == {AMBIGUOUS_FLAG, INFERRED_FLAG} <= set(ROLLOUT_FLAGS)
