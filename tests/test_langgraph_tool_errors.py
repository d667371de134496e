"""What a raising tool does to a rollout, for the two LangGraph agent APIs the quickstart names.

docs/quickstart.md (3b) states it; this checks it with real agents against
the served scripted policy: the model calls ``lookup`` with a key that is
not there (``KeyError``), then answers.

- ``langchain.agents.create_agent`` (LangChain v1): by default the
  exception leaves ``ainvoke`` and the rollout is ``failed``; with
  ``ToolErrorMiddleware`` or an async ``wrap_tool_call`` middleware the
  model sees the error and the rollout completes; a sync-only middleware
  under ``ainvoke`` fails the rollout with ``NotImplementedError``.
- ``langgraph.prebuilt.create_react_agent`` (deprecated): the same default;
  ``ToolNode(..., handle_tool_errors=True)`` gives the model the error.

Wherever the tool ran, its call is recorded with its error (the sync-only
middleware fails the run before the tool runs), and, where the model read
the error, with the ``ToolMessage`` text it read as its result.

Which results count as failed (docs/tool-calls.md): a tool that catches its
own error and returns ``"Error: ..."`` succeeded as far as LangChain knows
(recorded ``success``, that text its result); a tool that raises
``ToolException`` under ``handle_tool_error=True`` is answered with a
``ToolMessage(status="error")`` by LangChain itself (recorded ``error``);
arguments that fail the tool's schema are answered by ``create_agent``'s
ToolNode by default (recorded ``error``, the text the model read).
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
from langchain.agents.middleware import ToolErrorMiddleware, ToolRetryMiddleware, wrap_tool_call  # noqa: E402
from langchain.messages import ToolMessage  # noqa: E402
from langchain_core.tools import StructuredTool, ToolException, tool  # noqa: E402
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


def _say_error(exc, request):
    """ToolErrorMiddleware's handler, as its docs write one: name the exception type, not its message."""
    return f"{request.tool_call['name']} failed: {type(exc).__name__}"


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
    "create_agent+ToolErrorMiddleware": (
        lambda: create_agent(_llm(), [lookup], middleware=[ToolErrorMiddleware(on_error=_say_error)]), "completed",
        "lookup failed: KeyError"),
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
    assert (call.name, call.status, call.error) == ("lookup", "error", "KeyError: 'B7'"), call
    if status == "completed":
        assert call.result == contents[2], call  # the ToolMessage text the model read, not None
        read = [m["content"] for m in record.turns[-1].messages if m["role"] == "tool"]
        assert read == [call.result]
    else:
        assert call.result is None  # the exception ended the run: the model read nothing


@tool
def quiet_lookup(key: str) -> str:
    """Look a key up in the table."""
    try:
        return str({"A1": 42}[key])
    except KeyError as exc:
        return f"Error: no key {exc}"  # the tool's own error text: LangChain sees a result


def _strict_lookup(key: str) -> int:
    """Look a key up in the table."""
    if key != "A1":
        raise ToolException(f"no key {key}")  # LangChain answers the model with this, status error
    return 42


strict_lookup = StructuredTool.from_function(_strict_lookup, name="strict_lookup", handle_tool_error=True)


CASES = {
    "returns 'Error: ...'": (quiet_lookup, {"key": "B7"}, "success", None, "Error: no key 'B7'"),
    "raises ToolException under handle_tool_error": (strict_lookup, {"key": "B7"}, "error", "no key B7", "no key B7"),
    "arguments the schema refuses": (lookup, {"name": "B7"}, "error", "ValidationError", "Error invoking tool 'lookup'"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_what_create_agent_counts_as_a_failed_tool(case, served, tiny_tok):
    tool_, args, status, error, result = CASES[case]
    handle = served(ScriptedEngine(tiny_tok, [ScriptedReply.tool_call(tool_.name, args), "No such key."]))
    graph = create_agent(_llm(), [tool_])

    @rollout
    async def run(task):
        await graph.ainvoke({"messages": [("user", task.prompt)]})
        update_reward(0.0)

    [spec] = specs(handle, [Task(id="t1", prompt="What is stored under B7?")])
    with rollout_scope(spec):
        await run(spec.task)
    record = handle.store.get_rollout(spec.rollout_id)
    assert record.status is RolloutStatus.COMPLETED, record.error
    [call] = record.tool_calls
    [read] = [m["content"] for m in record.turns[-1].messages if m["role"] == "tool"]
    assert call.status == status and call.result == read and str(call.result).startswith(result), call
    assert (call.error is None) if error is None else (error in call.error), call


async def test_retried_tool_calls_each_attempt_and_the_last_carries_what_the_model_read(served, tiny_tok):
    """``ToolRetryMiddleware`` runs a raising tool three times, then answers the model with an error
    ToolMessage: three attempts recorded, all ``error``; only the last carries that text (the model read no
    earlier attempt). A tool that fails once and then succeeds: the success is what the model read."""
    attempts = []

    @tool
    def flaky(key: str) -> int:
        """Look a key up in the flaky table."""
        attempts.append(key)
        if key == "B7" or len(attempts) == 1:
            raise ConnectionError(f"table busy ({len(attempts)})")
        return 42

    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: (
        ScriptedReply.tool_call("flaky", {"key": "B7" if "B7" in prompt else "A1"}) if request.turn_index == 0
        else "Done.")))
    graph = create_agent(_llm(), [flaky], middleware=[ToolRetryMiddleware(max_retries=2, initial_delay=0.0,
                                                                          jitter=False)])

    @rollout
    async def run(task):
        await graph.ainvoke({"messages": [("user", task.prompt)]})
        update_reward(0.0)

    runs = specs(handle, [Task(id="flaky", prompt="What is under A1?"), Task(id="down", prompt="And under B7?")])
    recorded = {}
    for spec in runs:
        with rollout_scope(spec):
            await run(spec.task)
        recorded[spec.task.id] = handle.store.get_rollout(spec.rollout_id)
    for name, rollout_ in recorded.items():
        [read] = [m["content"] for m in rollout_.turns[-1].messages if m["role"] == "tool"]
        calls = rollout_.tool_calls
        assert len({c.call_id for c in calls}) == 1 and calls[-1].result == read, calls
        assert all(c.result is None for c in calls[:-1]), calls
        if name == "flaky":
            assert [c.status for c in calls] == ["error", "success"] and read == "42"
        else:
            assert [c.status for c in calls] == ["error"] * 3 and "ConnectionError" in read, read
