"""Context compaction captured from the wire: Strands' SummarizingConversationManager and LangChain v1's
SummarizationMiddleware, agents written as their docs teach, against the real coordinator on loopback with the
scripted policy (``_compacting_agents``). The episode stays one rollout: its summary call is a turn, the call after
it is ``compacted`` and carries the summary, and the samples of its segments share the episode's advantage."""

from __future__ import annotations

import pytest

from _adapter_support import specs
from _compacting_agents import KEYS, compacting_policy, lookup, task
from mtrl_adapters import aupdate_reward, rollout, rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.algorithms import build_samples, episode_tokens
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import BreakReason, RolloutStatus

CONFIG = MtrlConfig.from_dict({"core": {"max_turns": 24}})

pytest.importorskip("strands")
pytest.importorskip("langchain.agents.middleware")


def _strands_agent():
    from strands import Agent, tool
    from strands.agent.conversation_manager import SummarizingConversationManager
    from strands.models.openai import OpenAIModel

    from mtrl_adapters.strands import agent_factory

    # the user's own configuration: a real provider URL and key, untouched by mtrl
    model = OpenAIModel(client_args={"api_key": "sk-user-real-key", "base_url": "https://api.openai.com/v1"},
                        model_id="gpt-4o-mini")
    manager = SummarizingConversationManager(summary_ratio=0.5, preserve_recent_messages=2,
                                             summarization_system_prompt="Summarize the conversation in one line.")
    return agent_factory(lambda: Agent(model=model, tools=[tool(lookup)], conversation_manager=manager,
                                       callback_handler=None))


def _langchain_agent(summarizer=None):
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="gpt-4o-mini", api_key="sk-user-real-key", base_url="https://api.openai.com/v1",
                     max_retries=0)
    middleware = SummarizationMiddleware(model=llm, trigger=("messages", 8), keep=("messages", 3),
                                         **({"summarizer": summarizer} if summarizer else {}))
    return create_agent(model=llm, tools=[tool(lookup)], middleware=[middleware])


def _run_strands(handle, n: int = 1):
    make_agent = _strands_agent()

    @rollout
    async def run(t):
        agent = make_agent()
        result = await agent.invoke_async(t.prompt)
        await aupdate_reward(1.0 if "DONE" in str(result) else 0.0)

    return _run(handle, run, n)


def _run_langchain(handle, n: int = 1, summarizer=None):
    agent = _langchain_agent(summarizer)

    @rollout
    async def run(t):
        state = await agent.ainvoke({"messages": [{"role": "user", "content": t.prompt}]})
        await aupdate_reward(1.0 if "DONE" in str(state["messages"][-1].content) else 0.0)

    return _run(handle, run, n)


def _run(handle, run, n):
    import asyncio

    async def main():
        runs = specs(handle, [task(i) for i in range(n)], max_tokens=64)
        for spec in runs:
            with rollout_scope(spec):
                try:
                    await run(spec.task)
                except Exception:
                    pass
        return [handle.store.get_rollout(s.rollout_id) for s in runs]

    return asyncio.run(main())


def test_probe(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, compacting_policy, context_length=650), CONFIG)
    [r] = _run_strands(handle)
    print(r.status, r.error, r.reward)
    for t in r.turns:
        print(t.index, t.segment, t.break_reason, len(t.prompt_ids), len(t.completion_ids), repr(t.completion_text[:80]))
    handle2 = served(ScriptedEngine(tiny_tok, compacting_policy), CONFIG)
    [r] = _run_langchain(handle2)
    print(r.status, r.error, r.reward)
    for t in r.turns:
        print(t.index, t.segment, t.break_reason, len(t.prompt_ids), len(t.completion_ids), repr(t.completion_text[:80]))
    assert 0
