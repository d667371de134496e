"""What a raising tool does to a rollout, for the two LangGraph agent APIs the quickstart names.

docs/quickstart.md (3b) states it; this checks it with real agents against
the served scripted policy: the model calls ``lookup`` with a key that is
not there (``KeyError``), then answers.

- ``langchain.agents.create_agent`` (LangChain v1): by default the
  exception leaves ``ainvoke`` and the rollout is ``failed``; with an async
  ``wrap_tool_call`` middleware the model sees the error and the rollout
  completes; a sync-only middleware under ``ainvoke`` fails the rollout
  with ``NotImplementedError``.
- ``langgraph.prebuilt.create_react_agent`` (deprecated): the same default;
  ``ToolNode(..., handle_tool_errors=True)`` gives the model the error.

Wherever the tool ran, its call is recorded with its error (the sync-only
middleware fails the run before the tool runs).
"""

from __future__ import annotations

import warnings

import pytest

from _adapter_support import specs
from mtrl_adapters import rollout, rollout_scope, update_reward
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.types import RolloutStatus, Task

pytest.importorskip("langchain.agents")
from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import wrap_tool_call  # noqa: E402
from langchain.messages import ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # create_react_agent is deprecated in LangGraph 1.0: the point of the comparison
    from langgraph.prebuilt import create_react_agent  # noqa: E402

# One event loop for the module: langchain-openai shares its async HTTP client between ChatOpenAI
# objects, and a client's pooled connections belong to the loop that opened them.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@tool
def lookup(key: str) -> int:
    """Look a key up in the table."""
    return {"A1": 42}[key]


@wrap_tool_call
async def tool_errors_to_model(request, handler):
    try:
        return await handler(request)
    except Exception as exc:
        return ToolMessage(content=f"Error: {exc!r}", tool_call_id=request.tool_call["id"], status="error")


@wrap_tool_call
def sync_tool_errors_to_model(request, handler):
    try:
        return handler(request)
    except Exception as exc:
        return ToolMessage(content=f"Error: {exc!r}", tool_call_id=request.tool_call["id"], status="error")


def _llm():
    return ChatOpenAI(model="gpt-4o-mini", api_key="sk-user-real-key", max_retries=0)


def _react(tools):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(_llm(), tools)


GRAPHS = {
    "create_agent": (lambda: create_agent(_llm(), [lookup]), "failed", "KeyError: 'B7'"),
    "create_agent+async middleware": (
        lambda: create_agent(_llm(), [lookup], middleware=[tool_errors_to_model]), "completed", "Error: KeyError('B7')"),
    "create_agent+sync middleware": (
        lambda: create_agent(_llm(), [lookup], middleware=[sync_tool_errors_to_model]), "failed", "NotImplementedError"),
    "create_react_agent": (lambda: _react([lookup]), "failed", "KeyError: 'B7'"),
    "create_react_agent+ToolNode(handle_tool_errors=True)": (
        lambda: _react(ToolNode([lookup], handle_tool_errors=True)), "completed", "Error: KeyError('B7')"),
}


@pytest.mark.parametrize("name", list(GRAPHS))
async def test_a_raising_tool(name, served, tiny_tok):
    build, status, seen = GRAPHS[name]
    handle = served(ScriptedEngine(tiny_tok, [ScriptedReply.tool_call("lookup", {"key": "B7"}), "No such key."]))
    graph = build()

    @rollout
    async def run(task):
        state = await graph.ainvoke({"messages": [("user", task.prompt)]})
        update_reward(0.0)
        return [m.content for m in state["messages"]]

    [spec] = specs(handle, [Task(id="t1", prompt="What is stored under B7?")])
    with rollout_scope(spec):
        try:
            contents = await run(spec.task)
        except Exception as exc:  # the rollout's end is what the test reads
            contents = [f"{type(exc).__name__}: {exc}"]
    record = handle.store.get_rollout(spec.rollout_id)
    assert record.status is RolloutStatus(status), (record.status, record.error)
    if status == "completed":
        assert seen in contents[2] and contents[-1] == "No such key.", contents  # the model saw the error, answered
    else:
        assert seen in (record.error or ""), record.error
    if name == "create_agent+sync middleware":
        assert record.tool_calls == (), record.tool_calls  # refused before the tool ran
        return
    [call] = record.tool_calls
    assert (call.name, call.error) == ("lookup", "KeyError: 'B7'"), call
