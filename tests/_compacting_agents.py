"""Agents that compact their own context, written as their frameworks' docs teach, and the scripted policy they run.

Each task asks for ``KEYS`` lookups, one tool call each (``lookup("K10")``,
``lookup("K11")``, ...). The scripted policy reads from its prompt which keys
the conversation shows done (tool calls kept in the history, or listed in a
summary) and calls the next one; asked to summarise (Strands' "Please
summarize this conversation.", LangChain's summary prompt) it writes
``SUMMARY: keys numbers 10 to 15; looked up K10 K11 ...``. So an episode goes on correctly after a
compaction only when the summary it reads is the one its own summary call
wrote.
"""

from __future__ import annotations

import re
from typing import Any

from mtrl_runtime.engines import ScriptedReply
from mtrl_runtime.types import Task

KEYS = 6
_KEY = re.compile(r"\bK(\d\d)\b")
_START = re.compile(r"numbers (\d\d) to")
# what each framework's summary call asks (Strands' generate_summary; LangChain's DEFAULT_SUMMARY_PROMPT)
SUMMARY_ASKS = ("Please summarize this conversation.", "Context Extraction Assistant")


def task(i: int) -> Task:
    start = 10 + 10 * i
    return Task(id=f"c{i:02d}", prompt=f"Look up {KEYS} keys, numbers {start} to {start + KEYS - 1}, one call each.")


def compacting_policy(request: Any, prompt: str) -> ScriptedReply | str:
    """The scripted policy (see the module docstring); ``prompt`` is the rendered prompt text."""
    start = int(_START.search(prompt).group(1))
    if any(ask in prompt for ask in SUMMARY_ASKS):
        done = sorted(set(_KEY.findall(prompt)))
        return f"SUMMARY: keys numbers {start} to {start + KEYS - 1}; looked up " + " ".join(f"K{k}" for k in done) + "."
    done = {int(k) for k in _KEY.findall(prompt)}
    todo = [k for k in range(start, start + KEYS) if k not in done]
    if todo:
        return ScriptedReply.tool_call("lookup", {"key": f"K{todo[0]}"})
    return "All keys looked up. DONE"


def lookup(key: str) -> str:
    """Look a key up in the table."""
    return f"value-{key.lower()}"


def strands_agent(reward: Any) -> Any:
    """A ``@rollout`` Strands agent whose ``SummarizingConversationManager`` compacts on context overflow;
    ``reward(text)`` scores its final answer."""
    from strands import Agent, tool
    from strands.agent.conversation_manager import SummarizingConversationManager
    from strands.models.openai import OpenAIModel

    from mtrl_adapters import aupdate_reward, rollout
    from mtrl_adapters.strands import agent_factory

    # the user's own configuration: a real provider URL and key, untouched by mtrl
    model = OpenAIModel(client_args={"api_key": "sk-user-real-key", "base_url": "https://api.openai.com/v1"},
                        model_id="gpt-4o-mini")
    manager = SummarizingConversationManager(summary_ratio=0.5, preserve_recent_messages=2,
                                             summarization_system_prompt="Summarize the conversation in one line.")
    make_agent = agent_factory(lambda: Agent(model=model, tools=[tool(lookup)], conversation_manager=manager,
                                             callback_handler=None))

    @rollout
    async def run(t: Any) -> None:
        result = await make_agent().invoke_async(t.prompt)
        await aupdate_reward(reward(str(result)))

    return run


def langchain_agent(reward: Any, summarizer: Any = None) -> Any:
    """A ``@rollout`` LangChain v1 ``create_agent`` whose ``SummarizationMiddleware`` compacts past 8 messages,
    summarising with the agent's own chat model (or ``summarizer``, a function of the user's: no model call)."""
    import httpx
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from mtrl_adapters import aupdate_reward, rollout

    # an async HTTP client of its own: langchain-openai's shared one keeps connections of an earlier test's loop
    llm = ChatOpenAI(model="gpt-4o-mini", api_key="sk-user-real-key", base_url="https://api.openai.com/v1",
                     max_retries=0, http_async_client=httpx.AsyncClient())
    middleware = SummarizationMiddleware(model=llm, trigger=("messages", 8), keep=("messages", 3),
                                         **({"summarizer": summarizer} if summarizer else {}))
    agent = create_agent(model=llm, tools=[tool(lookup)], middleware=[middleware])

    @rollout
    async def run(t: Any) -> None:
        state = await agent.ainvoke({"messages": [{"role": "user", "content": t.prompt}]})
        await aupdate_reward(reward(str(state["messages"][-1].content)))

    return run
