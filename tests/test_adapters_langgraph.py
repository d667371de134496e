"""A real LangGraph ReAct agent with two tools, 16 concurrent rollouts against the served scripted policy.

All rollouts share one compiled graph and one ChatOpenAI object; the graph
is not changed for training (no callbacks in its config, no per-rollout
model): attribution lives in each rollout's own context.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import warnings

import pytest

from _adapter_support import (
    ERROR_KEY,
    add,
    afinish_episode,
    calling_first,
    check_attribution,
    finish_episode,
    lookup,
    policy,
    specs,
    tasks,
)
from mtrl_adapters import rollout, rollout_scope
from mtrl_runtime.engines import ScriptedEngine

pytest.importorskip("langgraph")
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # create_react_agent moved to langchain.agents (not installed here)
    from langgraph.prebuilt import create_react_agent  # noqa: E402

from mtrl_adapters.langgraph import MtrlCallbackHandler  # noqa: E402


def _graph():
    llm = ChatOpenAI(model="gpt-4o-mini", api_key="sk-user-real-key", base_url="https://api.openai.com/v1",
                     max_retries=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(llm, ToolNode([tool(lookup), tool(add)], handle_tool_errors=True))


def _turns(state) -> int:
    return sum(1 for m in state["messages"] if m.type == "ai")


async def test_langgraph_16_concurrent_rollouts_share_one_graph_and_model(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, policy))
    graph = _graph()  # compiled once, before any rollout

    @rollout
    async def run(task):
        state = await graph.ainvoke({"messages": [("user", task.prompt)]})
        await afinish_episode(task, _turns(state))
        return state["messages"][-1].content

    async def one(spec):
        with rollout_scope(spec) as ctx:
            try:
                await run(spec.task)
            except RuntimeError as exc:
                assert "crashed on purpose" in str(exc)
        return ctx

    runs = specs(handle, tasks(16))
    contexts = await asyncio.gather(*(one(s) for s in runs))
    for spec in runs:
        check_attribution(handle.store, spec)
    assert sorted(c.outcome.status for c in contexts).count("completed") == 15
    error_rollout = next(r for r in runs if ERROR_KEY in r.task.prompt)
    [call] = handle.store.get_rollout(error_rollout.rollout_id).tool_calls
    assert call.error == "KeyError: 'unknown key K03'"


def test_langgraph_sync_invoke_on_threads_with_explicit_callbacks(served, tiny_tok):
    """Sync ``invoke`` on threads; a handler also given in config is not double-counted."""
    handle = served(ScriptedEngine(tiny_tok, policy))
    graph = _graph()

    @rollout
    def run(task):
        state = graph.invoke({"messages": [("user", task.prompt)]}, config={"callbacks": [MtrlCallbackHandler()]})
        finish_episode(task, _turns(state))

    def one(spec):
        with rollout_scope(spec):
            try:
                run(spec.task)
            except RuntimeError:
                pass

    runs = specs(handle, tasks(8))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: contextvars.copy_context().run(one, s), runs))
    for spec in runs:
        check_attribution(handle.store, spec)  # exactly one record per tool call


def test_langgraph_outside_a_rollout_records_nothing(served, tiny_tok):
    """The configure hook stays installed; outside a rollout the handler does nothing."""
    from mtrl_adapters import current_rollout
    from mtrl_adapters.langgraph import instrument_langchain

    instrument_langchain()
    assert instrument_langchain() is False  # idempotent
    result = tool(add).invoke({"a": 1, "b": 2})
    assert result == 3 and current_rollout() is None


def test_langgraph_call_to_an_undeclared_tool_is_counted_not_flagged_unrecorded(served, tiny_tok, caplog):
    """The ToolNode answers a call to a tool it does not have with an error and runs nothing (no callback
    fires): the coordinator counts it as undeclared, and flags nothing unrecorded; the call it ran is recorded."""
    handle = served(ScriptedEngine(tiny_tok, calling_first("lookup_table")))
    graph = _graph()

    @rollout
    def run(task):  # sync: the shared ChatOpenAI's async client, reused on a later test's loop, fails (loop closed)
        state = graph.invoke({"messages": [("user", task.prompt)]})
        finish_episode(task, _turns(state))

    [spec] = specs(handle, tasks(1))
    with caplog.at_level("WARNING", logger="mtrl.coordinator"):
        with rollout_scope(spec):
            run(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    assert [c["function"]["name"] for t in stored.turns for c in t.tool_calls] == ["lookup_table", "lookup"]
    refusal = next(m for m in stored.turns[1].messages if m["role"] == "tool")
    assert "lookup_table is not a valid tool" in refusal["content"]  # what the model read
    assert stored.metrics["tool_calls_undeclared"] == 1.0 and "tool_calls_unrecorded" not in stored.metrics
    [ran] = stored.tool_calls
    assert (ran.name, ran.turn_index, ran.error) == ("lookup", 1, None)
    assert "unrecorded" not in caplog.text
