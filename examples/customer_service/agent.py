"""The support agent on LangGraph, trainable with mtrl: ``run`` is the ``@rollout`` entrypoint.

A small ReAct ``StateGraph`` (a model node, a ``ToolNode`` with
``handle_tool_errors=True``, and an edge that stops after ``max_turns``
model calls) and one ``ChatOpenAI`` serve every episode of an event loop.
The graph is compiled once per loop because ``ChatOpenAI``'s async HTTP
connections belong to the loop that opened them (and ``langchain_openai``
shares one default pool per base URL process-wide, so the model gets a
pool of its own here). What differs per episode travels in the run's
config: each ticket gets its own :class:`SupportSession` in a fresh
``Sandbox`` (torn down when the episode ends, however it ends), and the two
session tools find it through LangChain's injected ``RunnableConfig``.

Train it::

    mtrl train examples/customer_service/config.yaml --agent examples.customer_service.agent:run

While training, ``@rollout`` points ``ChatOpenAI``'s client at the policy
being trained and records every model call and tool call; outside training
the same ``run`` talks to ``base_url`` (by default a local ``mtrl serve``).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from typing import Annotated, Any, Callable, Mapping

import openai
from langchain_core.messages import AnyMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from typing_extensions import TypedDict

from mtrl_adapters import current_rollout, rollout, update_reward
from mtrl_runtime.envs import Sandbox, to_json

from .prompts import build_messages
from .reward import reward
from .tools import SESSION_TOOLS, SupportSession, lookup_tools, tool_specs

SESSION_KEY = "support_session"  # where the episode's session sits in config["configurable"]
DEFAULT_BASE_URL = "http://127.0.0.1:8731/v1"  # `mtrl serve` (used only outside training)
DEFAULT_MAX_TURNS = 8


def session_of(config: RunnableConfig) -> SupportSession:
    """The episode's session, from the config the graph run was given."""
    session = (config.get("configurable") or {}).get(SESSION_KEY)
    if not isinstance(session, SupportSession):
        raise RuntimeError(f"no SupportSession in config['configurable'][{SESSION_KEY!r}]; run the graph through run()")
    return session


def _lookup_fn(tool: Any) -> Callable[..., str]:
    def call(**arguments: Any) -> str:
        return to_json(tool(**arguments))  # unknown or missing arguments: an error result, not an exception

    return call


def _session_fn(name: str) -> Callable[..., str]:
    def call(config: RunnableConfig, **arguments: Any) -> str:
        return to_json(getattr(session_of(config), name)(**arguments))

    return call


def build_tools() -> list[StructuredTool]:
    """The five tools as LangChain tools, with the JSON schemas of ``tools.tool_specs()``."""
    lookups = lookup_tools()
    built = []
    for spec in tool_specs():
        name = spec["name"]
        fn = _session_fn(name) if name in SESSION_TOOLS else _lookup_fn(lookups[name])
        built.append(StructuredTool.from_function(fn, name=name, description=spec["description"],
                                                  args_schema=spec["parameters"]))
    return built


def build_llm() -> ChatOpenAI:
    """The agent's model: ``ChatOpenAI`` on ``mtrl serve``, with an HTTP pool of its own (see the module docstring)."""
    return ChatOpenAI(model="policy", base_url=DEFAULT_BASE_URL, api_key="unused-while-training", max_retries=0,
                      http_async_client=openai.DefaultAsyncHttpxClient())


class TicketState(TypedDict):
    """The graph's state: the conversation, and how many model calls it has made."""

    messages: Annotated[list[AnyMessage], add_messages]
    model_calls: int


def _configured(config: RunnableConfig, key: str, default: Any) -> Any:
    return (config.get("configurable") or {}).get(key, default)


def build_graph(llm: Any = None) -> Any:
    """The compiled graph: model -> tools -> model ... until a reply without tool calls or ``max_turns`` calls.

    ``llm`` defaults to :func:`build_llm`. When the budget runs out on a
    reply that still asks for a tool, the graph ends there, unanswered.
    """
    tools = build_tools()
    model = (llm if llm is not None else build_llm()).bind_tools(tools)

    async def call_model(state: TicketState, config: RunnableConfig) -> dict[str, Any]:
        reply = await model.ainvoke(state["messages"], config)
        return {"messages": [reply], "model_calls": state.get("model_calls", 0) + 1}

    def next_step(state: TicketState, config: RunnableConfig) -> str:
        wants_tools = bool(getattr(state["messages"][-1], "tool_calls", None))
        budget = _configured(config, "max_turns", DEFAULT_MAX_TURNS)
        return "tools" if wants_tools and state.get("model_calls", 0) < budget else END

    graph = StateGraph(TicketState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", next_step, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile()


class GraphPerLoop:
    """Builds the graph on first use in each event loop and shares it between that loop's episodes."""

    def __init__(self, factory: Callable[[], Any] = build_graph) -> None:
        self._factory = factory
        self._graphs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    def __call__(self) -> Any:
        loop = asyncio.get_running_loop()
        graph = self._graphs.get(loop)
        if graph is None:
            graph = self._graphs[loop] = self._factory()
        return graph


def _episode_id(task: Any) -> str:
    ctx = current_rollout()
    return ctx.rollout_id if ctx is not None else f"{getattr(task, 'id', 'ticket')}-{uuid.uuid4().hex[:8]}"


def _max_turns() -> int:
    ctx = current_rollout()
    return ctx.max_turns if ctx is not None and ctx.max_turns else DEFAULT_MAX_TURNS


def final_text(messages: list[Any]) -> str:
    """The agent's last message as text (content parts joined)."""
    content = messages[-1].content if messages else ""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content)
    return str(content)


async def resolve_ticket(graph: Any, task: Any, session: SupportSession, max_turns: int,
                         with_examples: bool = True) -> str:
    """Run the graph on one ticket; the final text, or "" when ``max_turns`` model calls ended without an answer."""
    config: RunnableConfig = {"configurable": {SESSION_KEY: session, "max_turns": max_turns},
                              "recursion_limit": 2 * max_turns + 1}
    state = await graph.ainvoke({"messages": build_messages(task, with_examples), "model_calls": 0}, config=config)
    last = state["messages"][-1]
    if getattr(last, "tool_calls", None):  # the budget ran out while the model still wanted a tool
        session.sandbox.end("max_turns")
        return ""
    session.sandbox.end("terminal: final answer")
    return final_text(state["messages"])


def make_agent(graph_factory: Callable[[], Any] | None = None, *, with_examples: bool = True) -> Callable[..., Any]:
    """A ``@rollout`` entrypoint; ``graph_factory()`` gives the graph to run (default: one per event loop)."""
    graphs = graph_factory if graph_factory is not None else GraphPerLoop()

    @rollout
    async def run(task: Any) -> str:
        graph = graphs()
        async with Sandbox(_episode_id(task)) as sandbox:  # torn down on any exit: answer, max turns, crash
            session = SupportSession(sandbox)
            text = await resolve_ticket(graph, task, session, _max_turns(), with_examples)
            snapshot = session.snapshot()
        if task.ground_truth is not None:  # training and evaluation; production tickets have none
            score, metrics = reward(text, task.ground_truth, snapshot)
            update_reward(score, metrics)
        return text

    return run


run = make_agent()
"""The entrypoint ``mtrl train --agent examples.customer_service.agent:run`` trains."""

__all__ = ["DEFAULT_BASE_URL", "SESSION_KEY", "GraphPerLoop", "build_graph", "build_llm", "build_tools",
           "final_text", "make_agent", "resolve_ticket", "run", "session_of"]
